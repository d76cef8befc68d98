"""Score prompt_v1/v2/v3 on the regular and hard sets against the simulator.

Starts a simulator subprocess, renders every dataset item into each prompt, calls
``/v1/chat/completions`` over HTTP and compares the answer's ``category`` and
``emotion`` with the ground truth. This is what a release gate would measure, so it
shows that the simulator's accuracy really depends on the prompt.

    python examples/complaints/evaluate.py --count 500
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from lockgate.simulator.testing import SimulatorProcess

HERE = Path(__file__).resolve().parent

try:
    from generate import dataset, load_prompt  # type: ignore[import-not-found]
except ImportError:  # run from elsewhere
    import importlib.util

    _spec = importlib.util.spec_from_file_location("complaints_generate", HERE / "generate.py")
    assert _spec is not None and _spec.loader is not None
    _gen = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_gen)
    dataset, load_prompt = _gen.dataset, _gen.load_prompt


def render(prompt: list[dict[str, str]], text: str) -> list[dict[str, str]]:
    """The chat messages for one item (``{name}`` placeholders, ``{{``/``}}`` literals)."""
    return [{"role": m["role"], "content": m["content"].format_map({"text": text})}
            for m in prompt]


async def score(url: str, prompt: list[dict[str, str]], items: list[dict[str, Any]],
                concurrency: int = 32) -> dict[str, float]:
    """Accuracy of ``category`` and ``emotion`` for one prompt on one dataset."""
    sem = asyncio.Semaphore(concurrency)
    hits = {"category": 0, "emotion": 0}
    async with aiohttp.ClientSession() as session:
        async def one(item: dict[str, Any]) -> None:
            body = {"model": "sim-complaints", "temperature": 0.2, "max_tokens": 200,
                    "messages": render(prompt, item["input"]["text"])}
            async with sem, session.post(f"{url}/chat/completions", json=body) as resp:
                doc = await resp.json()
            answer = orjson.loads(doc["choices"][0]["message"]["content"])
            for key in hits:
                hits[key] += answer.get(key) == item["expected"][key]

        await asyncio.gather(*(one(item) for item in items))
    return {key: n / len(items) for key, n in hits.items()}


async def _main(count: int, seed: int, url: str) -> None:
    sets = {kind: list(dataset(kind, count, seed)) for kind in ("regular", "hard")}
    print(f"{'prompt':10} {'dataset':8} {'category':>9} {'emotion':>8}   (n={count} each)")
    for version in ("v1", "v2", "v3"):
        prompt = load_prompt(HERE / f"prompt_{version}.txt")
        for kind, items in sets.items():
            acc = await score(url, prompt, items)
            print(f"prompt_{version:3} {kind:8} {acc['category']:9.1%} {acc['emotion']:8.1%}")


def main() -> None:
    """Command line; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=500, help="items per dataset")
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--accuracy-noise", type=float, default=0.0)
    args = ap.parse_args()
    with SimulatorProcess({"accuracy_noise": args.accuracy_noise}) as sim:
        asyncio.run(_main(args.count, args.seed, sim.url))


if __name__ == "__main__":
    main()
