"""Run a fake OpenAI-compatible LLM locally, to try workflows without an API key.

    python examples/fake_llm.py --port 9999

Then register it as a provider (it needs no API key, and takes any):

    orchestra provider add fake --kind openai_compatible --model-id fake-model \
        --base-url http://127.0.0.1:9999/v1 --no-api-key

It replies to any prompt and, when a worker
offers the `calculator` tool and the prompt contains a calculation, calls it first.
`--help` lists the options (`--mode echo`, `--delay`, `--zero-latency`, `--api-key`).
"""

import sys
from pathlib import Path

try:
    from orchestra.testing.fake_llm import main
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from orchestra.testing.fake_llm import main

if __name__ == "__main__":
    main()
