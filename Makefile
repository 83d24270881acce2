# The two commands of the README:
#   make run    the sidecar against VLLM_URL, or the demo on the built-in simulated vLLM and GPU
#   make test   every test (installs what the tests need first)
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: run demo test venv deps rules bench bench-listener detection clean

$(VPY): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip >/dev/null
	$(VPY) -m pip install -q -e '.[test]'
	@touch $(VPY)

venv: $(VPY)

deps:
	./scripts/install-system-deps.sh

run: $(VPY)
ifdef VLLM_URL
	$(VENV)/bin/vllm-sidecar-exporter --vllm-url $(VLLM_URL) $(ARGS)
else
	$(VENV)/bin/vllm-sidecar-exporter demo $(ARGS)
endif

demo: $(VPY)
	$(VENV)/bin/vllm-sidecar-exporter demo $(ARGS)

test: $(VPY) deps
	$(VPY) -m pytest -q -ra $(PYTEST_ARGS)

rules: $(VPY)
	$(VENV)/bin/vllm-sidecar-exporter rules --slo rules/slo.yaml --out-dir .
	$(VENV)/bin/vllm-sidecar-exporter dashboards --slo rules/slo.yaml --out-dir dashboards --k8s-out deploy/kubernetes/base/grafana-dashboards.yaml \
		--operator-out deploy/kubernetes/components/grafana-operator/grafana-dashboards.yaml

bench: $(VPY)
	$(VPY) bench/bench_parser.py
	$(VPY) bench/bench_fetch.py
	$(VPY) bench/bench_poll.py --write docs/performance.md

detection: $(VPY)
	$(VPY) -m exporter.harness.detection --out docs/detection.md

bench-listener: $(VPY)
	$(VPY) bench/bench_listener.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
