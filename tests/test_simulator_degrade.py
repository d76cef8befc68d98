"""The simulator's degradation switches (``degrade``) over real HTTP: each changes exactly
what it says for the model it names, the same way on every run under a seed, and can be
switched on and back off at run time."""

from __future__ import annotations

import http.client
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from lockgate.runtime.output import parse_output
from lockgate.simulator import SimulatorConfig
from lockgate.simulator.cli import build_parser, config_from_args
from lockgate.simulator.config import config_error
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import DeliveryRule

SYSTEM = """Label the complaint. Reply with JSON only:
{"category": "...", "emotion": 1, "summary": "..."}
- category: one of logistics, quality, refund, service, other
- emotion: integer 1-5
- summary: at most 12 characters
- if the text mentions 快递|物流 then category = logistics
- 坏了 → category = quality
- otherwise category = other
"""
FIELDS = ["category", "emotion", "summary"]
RULE = DeliveryRule(required_keys=tuple(FIELDS))
N = 200


def messages(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Complaint:\n<input>\n{text}\n</input>"}]


class Client:
    """A keep-alive client for one simulator."""

    def __init__(self, base_url: str) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self.conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1",
                                               parts.port or 80, timeout=10)

    def post(self, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        self.conn.request("POST", path, body=orjson.dumps(body),
                          headers={"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        return resp.status, orjson.loads(resp.read())

    def content(self, model: str, text: str) -> str:
        status, doc = self.post("/v1/chat/completions",
                                {"model": model, "messages": messages(text)})
        assert status == 200, doc
        out: str = doc["choices"][0]["message"]["content"]
        return out

    def contents(self, model: str, texts: list[str]) -> list[str]:
        return [self.content(model, t) for t in texts]


@pytest.fixture
def client(simulator: SimulatorProcess) -> Iterator[Client]:
    c = Client(simulator.base_url)
    try:
        yield c
    finally:
        c.conn.close()


def texts(n: int = N, word: str = "快递") -> list[str]:
    return [f"{word} 第{i}件 还没到。" for i in range(n)]


def share_near(count: int, n: int, p: float) -> bool:
    sd = (n * p * (1 - p)) ** 0.5
    return abs(count - n * p) < 4 * sd


# ---------------------------------------------------------------------------- config

def test_degrade_config_is_validated_and_errors_name_the_field(
        client: Client, simulator: SimulatorProcess) -> None:
    cases = [
        ({"sim-x": {"drop_fields": 1.5}}, "degrade.sim-x.drop_fields"),
        ({"sim-x": {"drop_feilds": 0.3}}, "degrade.sim-x.drop_feilds"),
        ({"*": {"drift": {"value": "a", "rate": -1}}}, "degrade.*.drift.rate"),
        ({"sim-x": {"drift": {"rate": 0.5}}}, "degrade.sim-x.drift.value"),
        ({"sim-x": {"latency_factor": 0.5}}, "degrade.sim-x.latency_factor"),
        ({"sim-x": {"drop_as": "zero"}}, "degrade.sim-x.drop_as"),
    ]
    for degrade, field in cases:
        status, doc = client.post("/_sim/config", {"degrade": degrade})
        assert status == 400
        message = doc["error"]["message"]
        assert message.startswith(field + ":") and "\n" not in message, message
        with pytest.raises(ValidationError) as exc:
            SimulatorConfig.model_validate({"degrade": degrade})
        assert config_error(exc.value).startswith(field + ":")
    assert simulator.configure()["degrade"] == {}  # refused patches changed nothing
    cfg = SimulatorConfig.model_validate({"degrade": {"*": {"broken_json": 0.1},
                                                      "sim-x": {"drop_fields": 0.2}}})
    x, y = cfg.degradation("sim-x"), cfg.degradation("sim-y")
    assert x is not None and y is not None
    assert (x.drop_fields, x.broken_json) == (0.2, 0.0)  # its own entry, not merged with *
    assert (y.drop_fields, y.broken_json) == (0.0, 0.1)
    assert SimulatorConfig().degradation("sim-x") is None


def test_degrade_is_settable_at_start() -> None:
    """In the config and with the ``--degrade`` flag (the flag wins)."""
    with SimulatorProcess({"seed": 3, "degrade": {"sim-x": {"drop_fields": 1.0}}},
                          extra_args=("--degrade", '{"sim-x": {"broken_json": 1.0}}')) as sim:
        c = Client(sim.base_url)
        try:
            assert parse_output(c.content("sim-x", "快递"), RULE).status == "invalid_json"
            assert orjson.loads(c.content("sim-y", "快递"))["category"] == "logistics"
        finally:
            c.conn.close()
        assert sim.stats()["degraded"] == {"broken_json": 1}
        assert sim.configure()["degrade"]["sim-x"]["drop_fields"] == 0.0


def test_degrade_flag_errors_name_the_field() -> None:
    args = build_parser().parse_args(["--degrade", '{"sim-x": {"broken_json": 2}}'])
    with pytest.raises(ValidationError) as exc:
        config_from_args(args)
    assert config_error(exc.value).startswith("degrade.sim-x.broken_json:")
    with pytest.raises(ValueError, match="--degrade must be a JSON object"):
        config_from_args(build_parser().parse_args(["--degrade", "[1]"]))


# ---------------------------------------------------------------------------- switches

def test_drop_fields_omits_fields_of_a_share_of_answers(client: Client,
                                                        simulator: SimulatorProcess) -> None:
    inputs = texts()
    healthy = [orjson.loads(c) for c in client.contents("sim-x", inputs)]
    assert all(list(a) == FIELDS for a in healthy)
    simulator.configure(seed=11, degrade={"sim-x": {"drop_fields": 0.3}})
    first = client.contents("sim-x", inputs)
    answers = [orjson.loads(c) for c in first]
    dropped = [i for i, a in enumerate(answers) if a != healthy[i]]
    assert share_near(len(dropped), N, 0.3)
    for i in dropped:  # by default every field but the first goes
        assert answers[i] == {"category": healthy[i]["category"]}
        parsed = parse_output(first[i], RULE)
        assert parsed.completeness == pytest.approx(1 / 3)
    # other models are untouched; a rerun (even after a reset) gives the same answers
    assert [orjson.loads(c) for c in client.contents("sim-y", inputs)] == healthy
    simulator.reset()
    assert client.contents("sim-x", inputs) == first
    assert simulator.stats()["degraded"] == {"drop_fields": len(dropped)}
    # another seed hits other requests, about as many
    simulator.configure(seed=12)
    other = [orjson.loads(c) for c in client.contents("sim-x", inputs)]
    hit = {i for i, a in enumerate(other) if a != healthy[i]}
    assert hit != set(dropped) and share_near(len(hit), N, 0.3)
    # switched off at run time: back to the healthy answers
    simulator.configure(degrade={})
    assert [orjson.loads(c) for c in client.contents("sim-x", inputs)] == healthy


@pytest.mark.parametrize(("drop_as", "blank"), [("null", None), ("blank", "")])
def test_drop_fields_named_fields_as_null_or_blank(client: Client, simulator: SimulatorProcess,
                                                   drop_as: str, blank: Any) -> None:
    simulator.configure(seed=1, degrade={"*": {"drop_fields": 1.0, "dropped": ["summary"],
                                               "drop_as": drop_as}})
    for model in ("sim-x", "sim-y"):  # "*" applies to every model
        answer = orjson.loads(client.content(model, "快递没到"))
        assert answer == {"category": "logistics", "emotion": answer["emotion"],
                          "summary": blank}
        assert parse_output(orjson.dumps(answer).decode(), RULE).completeness \
            == pytest.approx(2 / 3)


def test_drift_moves_one_label_to_others(client: Client, simulator: SimulatorProcess) -> None:
    inputs = texts(N // 2) + texts(N // 2, "坏了")
    healthy = [orjson.loads(c) for c in client.contents("sim-x", inputs)]
    before = Counter(a["category"] for a in healthy)
    assert before == {"logistics": N // 2, "quality": N // 2}
    simulator.configure(seed=5, degrade={"sim-x": {"drift": {"value": "logistics",
                                                             "rate": 0.6}}})
    answers = [orjson.loads(c) for c in client.contents("sim-x", inputs)]
    moved = [i for i, a in enumerate(answers) if a != healthy[i]]
    assert share_near(len(moved), N // 2, 0.6)
    for i in moved:  # only logistics answers move, only their category, to other values
        assert healthy[i]["category"] == "logistics"
        assert answers[i]["category"] in ("quality", "refund", "service", "other")
        assert {**answers[i], "category": "logistics"} == healthy[i]
    assert simulator.stats()["degraded"] == {"drift": len(moved)}
    assert client.contents("sim-x", inputs) == [orjson.dumps(a).decode() for a in answers]
    # a fixed target value
    simulator.configure(degrade={"sim-x": {"drift": {"value": "logistics", "rate": 1.0,
                                                     "field": "category", "to": "service"}}})
    after = Counter(orjson.loads(c)["category"] for c in client.contents("sim-x", inputs))
    assert after == {"service": N // 2, "quality": N // 2}
    simulator.configure(degrade={})
    assert [orjson.loads(c) for c in client.contents("sim-x", inputs)] == healthy


def test_slow_adds_latency_to_one_model(client: Client, simulator: SimulatorProcess) -> None:
    simulator.configure(degrade={"sim-x": {"latency_add_ms": 120}})
    t0 = time.perf_counter()
    answer = client.content("sim-x", "快递")
    assert time.perf_counter() - t0 >= 0.12
    assert answer == client.content("sim-y", "快递")  # same content, only later
    assert simulator.stats()["degraded"] == {"slow": 1}
    # a factor stretches the configured latency of that model only
    simulator.configure(latency=40, degrade={"sim-x": {"latency_factor": 4}})
    t0 = time.perf_counter()
    client.content("sim-x", "快递")
    assert time.perf_counter() - t0 >= 0.16
    assert simulator.stats()["degraded"] == {"slow": 2}
    client.content("sim-y", "快递")
    simulator.configure(degrade={})
    client.content("sim-x", "快递")
    assert simulator.stats()["degraded"] == {"slow": 2}


def test_broken_json_lands_as_invalid_json(client: Client, simulator: SimulatorProcess) -> None:
    inputs = texts()
    healthy = client.contents("sim-x", inputs)
    simulator.configure(seed=9, degrade={"sim-x": {"broken_json": 0.25}})
    first = client.contents("sim-x", inputs)
    broken = [i for i, c in enumerate(first) if c != healthy[i]]
    assert share_near(len(broken), N, 0.25)
    for i in broken:
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(first[i])
        for rule in (RULE, DeliveryRule()):  # the whole repair ladder recovers nothing
            assert parse_output(first[i], rule).status == "invalid_json"
    stats = simulator.stats()
    assert stats["by_outcome"] == {"ok": N * 2 - len(broken), "broken_json": len(broken)}
    assert stats["successes"] == N * 2 - len(broken)  # a broken answer is no success
    simulator.reset()
    assert client.contents("sim-x", inputs) == first
    assert client.contents("sim-y", inputs) == healthy
    simulator.configure(degrade={})
    assert client.contents("sim-x", inputs) == healthy


def test_switches_combine_and_faults_come_first(client: Client,
                                                simulator: SimulatorProcess) -> None:
    simulator.configure(seed=2, rate_500=1.0,
                        degrade={"sim-x": {"broken_json": 1.0, "drop_fields": 1.0}})
    status, _doc = client.post("/v1/chat/completions",
                               {"model": "sim-x", "messages": messages("快递")})
    assert status == 500
    simulator.configure(rate_500=0.0)
    assert parse_output(client.content("sim-x", "快递"), RULE).status == "invalid_json"
    simulator.configure(degrade={"sim-x": {"drop_fields": 1.0,
                                           "drift": {"value": "logistics", "rate": 1.0,
                                                     "to": "other"}}})
    assert orjson.loads(client.content("sim-x", "快递")) == {"category": "other"}
