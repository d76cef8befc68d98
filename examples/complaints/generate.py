"""Synthetic Chinese customer complaints with ground-truth labels, generated deterministically.

Two outputs:

* task lines for lockgate (``--count N --seed S --out tasks.jsonl``): the six meta-fields
  plus ``batch_id`` and ``metadata.expected`` (the ground truth, for scoring);
* labelled datasets for the release gate (``--dataset regular|hard --out FILE``):
  ``{"id", "input": {"text"}, "expected": {"category", "emotion"}}``.

Every complaint is an opener, a problem sentence of its category and an emotion phrase
of its intensity. In the *regular* style the problem sentence uses an obvious keyword
of its category (快递, 质量, 退款, 客服 …). In the *hard* style it avoids those words:
either with a less common word that only a more thorough prompt lists (包裹, 故障,
到账, 敷衍 …) or with a paraphrase no keyword rule catches. Sentences of one category
never contain another category's keywords, so the ground truth is unambiguous.

    python examples/complaints/generate.py --count 1000 --seed 7 --out tasks.jsonl
    python examples/complaints/generate.py --dataset hard --count 200 --out hard.jsonl
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
CATEGORIES = ("logistics", "quality", "refund", "service", "other")
CATEGORY_WEIGHTS = (30, 25, 20, 15, 10)
EMOTION_WEIGHTS = (10, 25, 30, 20, 15)  # emotion 1..5

PRODUCTS = ("空气炸锅", "蓝牙耳机", "羽绒服", "电饭煲", "儿童书包", "保温杯", "扫地机器人",
            "咖啡机", "运动鞋", "台灯", "床上四件套", "电动牙刷", "行李箱", "加湿器")

OPENERS = ("上周在你们店买了一个{product}，", "我{days}天前下单的{product}，",
           "之前买的{product}，", "这次购买的{product}，", "给家里老人买的{product}，",
           "双十一抢的{product}，", "朋友推荐我买的{product}，")
OTHER_OPENERS = ("在你们平台购物好几年了，", "我是老用户了，", "最近一次购物时发现，",
                 "这两天用你们的平台，")

# Problem sentences: "regular" ones use an obvious keyword of the category; "hard" ones
# do not (tier-2 words or paraphrases). {days} is filled with a number of days.
PROBLEMS: dict[str, dict[str, tuple[str, ...]]] = {
    "logistics": {
        "regular": (
            "快递已经{days}天了还没送到",
            "物流信息一直停在同一个城市不动",
            "说好48小时内发货，结果拖了一个星期",
            "配送员没联系我就把东西放在门口，结果丢了",
            "快递显示已签收，可是我根本没收到",
            "物流太慢了，等得花儿都谢了",
        ),
        "hard": (
            "包裹在路上走了{days}天还没到我手里",
            "显示已经签收了，但家里根本没人拿到东西",
            "等了快两周，送货的人一直说在路上",
            "订单状态一直是运输中，已经十几天了",
            "东西到现在还没见到影子，网上也查不到进度",
            "等了半个月，东西还在外省转来转去",
        ),
    },
    "quality": {
        "regular": (
            "用了不到{days}天就坏了",
            "收到时外壳就有破损",
            "做工粗糙，表面全是瑕疵",
            "质量和宣传的完全不一样",
            "开机没多久就坏了，再也打不开",
            "质量太差，一洗就掉色",
        ),
        "hard": (
            "穿了一次就开线了，做工实在一般",
            "用了两次就出现故障，屏幕一直闪",
            "拿到手有股很重的异味，根本不敢用",
            "洗了一次就掉色，别的衣服都被染了",
            "按钮按下去没有反应，插上电也不亮",
            "盖子拧不紧，装了水就往外漏",
        ),
    },
    "refund": {
        "regular": (
            "申请退款已经{days}天了，钱还没到账",
            "退货寄回去一周了，一直没人处理退款",
            "商家答应退钱，到现在也没动静",
            "退款被莫名其妙驳回了",
            "退货运费也要我自己出，说好的七天无理由呢",
        ),
        "hard": (
            "钱到现在还没到账，说好三个工作日的",
            "东西已经退回去了，钱却迟迟不返还",
            "东西寄回去{days}天了，到账时间却一拖再拖",
            "申请取消订单后，钱一直没回到我的卡里",
            "商家同意把钱还给我，但半个月过去了毫无动静",
        ),
    },
    "service": {
        "regular": (
            "联系客服好几次都没人回复",
            "客服态度非常冷淡，问什么都说不知道",
            "售后一直推来推去，没人负责",
            "找售后处理，对方直接挂断",
            "客服的解释前后矛盾，完全不专业",
        ),
        "hard": (
            "留言{days}天了都没人回复",
            "问了三遍，对方一直在敷衍我",
            "打了五次电话都没人接",
            "接待我的人说话很冲，还说是我自己的问题",
            "每次咨询都是机器人自动回答，找不到真人",
        ),
    },
    "other": {
        "regular": (
            "会员积分莫名其妙被清零了",
            "开发票的申请提交了三次都失败",
            "优惠券明明没过期却用不了",
            "刚买完第二天就降价了一百多",
            "账号突然被冻结，登录不上",
        ),
        "hard": (
            "下单时页面显示的金额和最后扣的不一样",
            "App 一打开就闪退，什么也做不了",
            "活动规则写得不清楚，感觉被套路了",
            "个人资料里的手机号改不了，系统一直报错",
        ),
    },
}

EMOTIONS: dict[int, dict[str, tuple[str, ...]]] = {
    5: {"regular": ("真是气死我了！", "简直忍无可忍！", "我一定要投诉到底！",
                    "再也不会在你们家买东西了！"),
        "hard": ("这是我遇到过最离谱的购物经历！！", "我现在非常愤怒！",
                 "你们就是这样对待老顾客的吗？！")},
    4: {"regular": ("非常生气。", "太让人失望了。", "真的很不满意。"),
        "hard": ("心情糟透了。", "这体验实在太糟糕了。", "真的很窝火。")},
    3: {"regular": ("有点失望。", "不太满意。", "心里有些不舒服。"),
        "hard": ("感觉不太好。", "多少有些遗憾。")},
    2: {"regular": ("希望尽快处理。", "麻烦帮忙看一下。", "请帮我处理一下。"),
        "hard": ("等你们的消息。", "还请跟进一下。")},
    1: {"regular": ("只是反馈一下情况。", "顺便提个建议。", "不着急，有空看看就行。"),
        "hard": ("仅供参考。", "说一下而已。")},
}

ANGRY_EMOJI = ("😡", "😤")


def complaint(rng: random.Random, style: str) -> tuple[str, str, int]:
    """One complaint text with its category and emotion, in ``regular`` or ``hard`` style."""
    category = rng.choices(CATEGORIES, CATEGORY_WEIGHTS)[0]
    emotion = rng.choices((1, 2, 3, 4, 5), EMOTION_WEIGHTS)[0]
    days = rng.randint(3, 15)
    product = rng.choice(PRODUCTS)
    opener = rng.choice(OTHER_OPENERS if category == "other" else OPENERS)
    problem = rng.choice(PROBLEMS[category][style])
    feeling = rng.choice(EMOTIONS[emotion][style])
    text = (opener + problem + "，" + feeling).format(product=product, days=days)
    if emotion == 5 and rng.random() < 0.2:
        text += rng.choice(ANGRY_EMOJI)
    return text, category, emotion


def load_prompt(path: Path) -> list[dict[str, str]]:
    """Chat messages of a prompt file: ``[system]`` and ``[user]`` lines start sections."""
    messages: list[dict[str, str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        marker = line.strip().lower()
        if marker in ("[system]", "[user]", "[assistant]"):
            messages.append({"role": marker[1:-1], "content": ""})
        elif messages:
            messages[-1]["content"] += line + "\n"
        elif line.strip():
            raise ValueError(f"{path}: text before the first [system]/[user] marker")
    for m in messages:
        m["content"] = m["content"].strip("\n")
    if not messages:
        raise ValueError(f"{path}: no [system]/[user] sections")
    return messages


def tasks(count: int, seed: int, prompt: list[dict[str, str]], date: str,
          batch_id: str, hard_share: float) -> Iterator[dict[str, Any]]:
    """lockgate task lines (six meta-fields + batch_id + metadata.expected)."""
    rng = random.Random(seed)
    for seq in range(1, count + 1):
        style = "hard" if rng.random() < hard_share else "regular"
        text, category, emotion = complaint(rng, style)
        yield {
            "task_id": f"{date}_cs_{seq:06d}",
            "batch_id": batch_id,
            "prompt_template": prompt,
            "input_data": {"text": text},
            "model_config": {"name": "sim-complaints", "temperature": 0.2,
                             "max_tokens": 200, "timeout_ms": 20000},
            "delivery_rule": {"format": "json",
                              "required_keys": ["category", "emotion", "summary"],
                              "fallback_values": {"summary": ""}},
            "retry_policy": {"max_retries": 4, "base_delay_ms": 200, "backoff_factor": 2.0,
                             "jitter": 0.2, "cap_ms": 5000, "stop_on": ["invalid_request"]},
            "metadata": {"style": style,
                         "expected": {"category": category, "emotion": emotion}},
        }


def dataset(kind: str, count: int, seed: int) -> Iterator[dict[str, Any]]:
    """Labelled release-gate items of one style (``regular`` or ``hard``)."""
    rng = random.Random(f"{kind}:{seed}")
    for i in range(1, count + 1):
        text, category, emotion = complaint(rng, kind)
        yield {"id": f"{kind}-{i:05d}", "input": {"text": text},
               "expected": {"category": category, "emotion": emotion}}


def _write(lines: Iterator[dict[str, Any]], out: str) -> int:
    n = 0
    with (sys.stdout.buffer if out == "-" else open(out, "wb")) as fh:
        for line in lines:
            fh.write(orjson.dumps(line) + b"\n")
            n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    """Command line; see the module docstring."""
    ap = argparse.ArgumentParser(description="Generate synthetic Chinese complaints.")
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--out", default="-", help="output file ('-' = stdout)")
    ap.add_argument("--dataset", choices=("regular", "hard"),
                    help="write a labelled dataset instead of task lines")
    ap.add_argument("--prompt", default=str(HERE / "prompt_v1.txt"),
                    help="prompt file for task lines (default prompt_v1.txt)")
    ap.add_argument("--date", default="20261201", help="date part of task ids")
    ap.add_argument("--batch-id", default=None, help="batch id (default {date}_cs)")
    ap.add_argument("--hard-share", type=float, default=0.2,
                    help="share of hard-style complaints among task lines")
    args = ap.parse_args(argv)
    if args.dataset:
        n = _write(dataset(args.dataset, args.count, args.seed), args.out)
    else:
        prompt = load_prompt(Path(args.prompt))
        n = _write(tasks(args.count, args.seed, prompt, args.date,
                         args.batch_id or f"{args.date}_cs", args.hard_share), args.out)
    print(f"wrote {n} lines to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
