"""What the pack asks of Prometheus at every evaluation: no per-replica series is read over more
than an hour on a current vLLM. A read over days costs its window's samples for every series it
selects, and replicas are many and renamed at every rollout (each name a series of its own that
stays in the window for its whole length), so the long windows read per-model series only. The
one exception reads nothing on a current release (below)."""

import yaml

from conftest import ROOT
from exporter.analysis.promql.ast import MatrixSelector, SubqueryExpr, VectorSelector, walk
from exporter.analysis.promql.parser import parse
from exporter.pack import rules as rules_mod
from exporter.slo import load_slo

HOUR_MS = 3_600_000


def long_reads(rules_text: str, over_ms: int):
    """{series name: longest window in ms} for every selector read over more than ``over_ms``."""
    out = {}
    for group in yaml.safe_load(rules_text)["groups"]:
        for rule in group["rules"]:
            for node in walk(parse(rule["expr"])):
                if isinstance(node, MatrixSelector) and node.range_ms > over_ms:
                    selectors, rng = [node.selector], node.range_ms
                elif isinstance(node, SubqueryExpr) and node.range_ms > over_ms:
                    selectors, rng = [n for n in walk(node.expr) if isinstance(n, VectorSelector)], node.range_ms
                else:
                    continue
                for sel in selectors:
                    out[sel.name] = max(out.get(sel.name, 0), rng)
    return out


def test_long_windows_read_per_model_series_only():
    text = (ROOT / rules_mod.PLAIN_PATH).read_text()
    reads = long_reads(text, HOUR_MS)
    # the check can see what it looks for: the pack does read days (burn rates, baselines, capacity)
    assert max(reads.values()) >= 14 * 24 * HOUR_MS and len(reads) >= 5, reads
    per_replica = {name for name in reads if not name.startswith("namespace_model:")}
    # the old-release batch peak: the running batch only where vLLM gives no waiting reason
    assert per_replica == {"namespace_pod_model:vllm_requests_running_old_release:sum"}, per_replica


def test_the_old_release_series_is_empty_where_vllm_gives_the_reason():
    rules = {r.get("record"): r["expr"] for g in yaml.safe_load((ROOT / rules_mod.PLAIN_PATH).read_text())["groups"]
             for r in g["rules"]}
    expr = rules["namespace_pod_model:vllm_requests_running_old_release:sum"]
    assert expr.startswith("namespace_pod_model:vllm_requests_running:sum\nunless on (namespace, pod, model_name)\n")
    assert 'vllm:num_requests_waiting_by_reason{reason="capacity"}' in expr


def test_a_renamed_replica_level_moves_the_check_with_it():
    """Replica labels from the SLO rename the levels; the reads stay per model under any names."""
    slo = load_slo(None)
    slo["replica_labels"] = ["cluster", "namespace", "pod"]
    text = rules_mod.render_plain(slo)
    reads = long_reads(text, HOUR_MS)
    assert {n for n in reads if not n.startswith("cluster_namespace_model:")} == \
        {"cluster_namespace_pod_model:vllm_requests_running_old_release:sum"}
