# The two commands of the README:
#   make run    the demo on the built-in simulated vLLM and GPU, or, with VLLM_URL=..., the same
#               live view of a real vLLM (`vllm-sidecar-exporter top`)
#   make test   every test (installs what the tests need first)
# Prerequisites (Debian 12 / Ubuntu 24.04): make, python3 (3.10+), python3-venv, git; root or sudo
# for apt-get (make test installs Prometheus, Alertmanager, VictoriaMetrics with vmalert and Node.js when they are missing).
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
PYTEST_ARGS ?=
# pytest-xdist workers: the suite waits on real servers (vLLM, Prometheus, promtool) as much as it
# computes, so three workers keep two cores busy
TEST_WORKERS ?= 3

.PHONY: run demo top test e2e-perf venv deps rules docs bench bench-listener bench-pack bench-annotations detection clean

$(VPY): pyproject.toml scripts/kubectl-requirements.txt
	@command -v $(PY) >/dev/null 2>&1 || { echo "make: $(PY) not found: install Python 3.10+ (apt-get install python3 python3-venv)" >&2; exit 1; }
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { echo "make: $(PY) is older than 3.10: install Python 3.10+ (or make PY=python3.12 ...)" >&2; exit 1; }
	@$(PY) -c 'import ensurepip, venv' 2>/dev/null || { echo "make: python3-venv is missing: apt-get install python3-venv" >&2; exit 1; }
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
	$(VPY) -m pip install -q --disable-pip-version-check -e '.[test]'
	./scripts/install-kubectl.sh $(VPY)
	@touch $(VPY)

venv: $(VPY)

deps:
	./scripts/install-system-deps.sh

run: $(VPY)
ifdef VLLM_URL
	$(VENV)/bin/vllm-sidecar-exporter top --vllm-url $(VLLM_URL) $(ARGS)
else
	$(VENV)/bin/vllm-sidecar-exporter demo $(ARGS)
endif

demo: $(VPY)
	$(VENV)/bin/vllm-sidecar-exporter demo $(ARGS)

top: $(VPY)
	$(VENV)/bin/vllm-sidecar-exporter top $(ARGS)

# the virtualenv's bin first on PATH: its kubectl and console script are the ones the tests run
test: $(VPY) deps
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VPY) -m pytest -q -ra -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# the live performance checks on the real CPU vLLM (capacity read from a live load ramp, the gate
# on live `vllm bench serve` runs): their figures depend on the machine's load, so make test leaves
# them out; with the flight recorder's long real-vLLM proof, about 12 minutes on an idle 2-core machine
e2e-perf: $(VPY) deps
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VPY) -m pytest -q -ra -m 'perf or long' tests/e2e $(PYTEST_ARGS)

rules: $(VPY)
	$(VENV)/bin/vllm-sidecar-exporter rules --slo rules/slo.yaml --out-dir .
	$(VENV)/bin/vllm-sidecar-exporter dashboards --slo rules/slo.yaml --out-dir dashboards --k8s-out deploy/kubernetes/base/grafana-dashboards.yaml \
		--operator-out deploy/kubernetes/components/grafana-operator/grafana-dashboards.yaml

# the derived series' rows of the README's metric tables and of docs/interface.md, rendered from the
# sidecar's own tables into their marked regions (exporter/runtime/collectors/metric_docs.py; with
# --check it only says which differ, as tests/project/test_metric_docs.py does)
docs: $(VPY)
	$(VPY) -m exporter.runtime.collectors.metric_docs README.md docs/interface.md

# every benchmark (about 41 minutes); the poll loop's and the pack's write their sections of
# docs/performance.md, the listener's prints its table (its section keeps the analysis of a run)
bench: $(VPY) deps
	$(VPY) bench/bench_parser.py
	$(VPY) bench/bench_fetch.py
	$(VPY) bench/bench_poll.py --write docs/performance.md
	$(VPY) bench/bench_listener.py
	$(VPY) bench/bench_flight_scrape.py
	$(VPY) bench/bench_pack.py --write docs/performance.md

# the whole detection matrix (renders kept in ~/.cache: a changed pack re-evaluates without re-rendering)
detection: $(VPY)
	VLLM_SIDECAR_MATRIX_CACHE=$${VLLM_SIDECAR_MATRIX_CACHE:-$$HOME/.cache/vllm-sidecar-exporter/matrix} \
		$(VPY) -m exporter.harness.detection --matrix --out docs/detection.md

bench-listener: $(VPY)
	$(VPY) bench/bench_listener.py $(ARGS)

# what the alerting pack costs a real Prometheus scraping 100 simulated pods, then each rule asked of a
# quiet Prometheus over the stored data (about 14 minutes
# per scrape interval, 15 s and 5 s; ARGS="--scrape 15 --variant before=OLD.rules.yml" compares a change)
bench-pack: $(VPY) deps
	$(VPY) bench/bench_pack.py --write docs/performance.md $(ARGS)

# what an active alert's annotations cost Prometheus at every evaluation (about 4 minutes)
bench-annotations: $(VPY) deps
	$(VPY) bench/bench_annotations.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
