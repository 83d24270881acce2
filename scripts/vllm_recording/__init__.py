"""The recorder of real CPU vLLM runs behind ``scripts/record_vllm.py`` (whose docstring says what it
records and how to run it), one module per job, each importing only those above it:

- ``scenarios``: the served model, target labels, vLLM flags and every scenario's phases and notes;
- ``processes``: vLLM, the sidecar and Prometheus as process groups, the page poller;
- ``load``: the load generator (prompts, requests, open- and closed-loop streams);
- ``promdata``: Prometheus' API to OpenMetrics and back, counter and histogram reads;
- ``facts``: the client, server and alert facts per phase;
- ``provenance``: PROVENANCE.md from meta.json;
- ``bench``: the ``bench`` command and its PROVENANCE.md;
- ``recording``: a scenario's run from start to files, and ``reprocess``;
- ``lora``, ``probe``: the other commands.

Importing it puts the repository root first on ``sys.path``, as the script always did, so that the
``exporter`` it runs and reads is this checkout's.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
