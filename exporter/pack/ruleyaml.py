"""Writing rule files: the rule groups' names and the YAML form every rendered rule file
uses (block scalars for multi-line text, the file's key order kept). Read by ``rules`` (the
Prometheus files) and ``vmalert`` (the vmalert target) alike."""

from __future__ import annotations

from typing import Any

import yaml

GROUP = "vllm-sidecar-exporter"
STEADY_GROUP = "vllm-sidecar-exporter-steady"  # the alerts that wait steady_for or longer (cadence)
SLOW_GROUP = "vllm-sidecar-exporter-slow"  # the alerts that wait slow_for or longer (cadence)
VIEWS_GROUP = "vllm-sidecar-exporter-views"  # the rules no alert reads (views)


class _Dumper(yaml.SafeDumper):
    pass


def _str_repr(dumper: yaml.SafeDumper, data: str):
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str_repr)

def dump(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=1000, default_flow_style=False)
