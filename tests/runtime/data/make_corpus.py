"""Build ``corpus.jsonl``: realistic model outputs for the repair-ladder tests.

Run ``python tests/runtime/data/make_corpus.py`` to regenerate (deterministic).

Each line is one raw output with what a correct ladder must make of it:
``{"id", "rule", "kind", "raw", "expect": {"usable", "status", "value"?, "required"?}}``.
``status`` is a list of acceptable statuses (one, except where the kind makes two
equally right). ``value`` is the exact expected value; ``required`` lists the fields
that must match the source record when the rest may legitimately differ (truncation).

The mutations imitate what models actually do: Markdown fences, polite chatter before
and after (English and Chinese), trailing commas, single quotes, unquoted keys,
comments, Python literals, truncation at ``max_tokens``, misspelled, aliased and
re-cased keys, numbers and booleans as strings, enum members in the wrong case,
missing and extra fields, double-encoded JSON, a one-element array around the object.
The unusable ones are refusals, prose answers, bracket noise, outputs cut off before
the first field, and JSON that breaks the schema beyond repair.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent

RULES: dict[str, dict[str, Any]] = {
    "sentiment": {
        "schema": {
            "type": "object",
            "properties": {
                "sentiment": {"enum": ["positive", "negative", "neutral"]},
                "score": {"type": "number", "minimum": 0, "maximum": 1},
                "keywords": {"type": "array", "items": {"type": "string"}},
                "summary": {"type": "string"},
            },
            "required": ["sentiment", "score"],
        },
        "fallback_values": {"keywords": []},
        "aliases": {"sentiment": ["label", "polarity"], "score": ["confidence"]},
    },
    "product_zh": {
        "schema": {
            "type": "object",
            "properties": {
                "商品名称": {"type": "string"},
                "价格": {"type": "number"},
                "颜色": {"type": "string"},
                "库存": {"type": "integer"},
                "是否包邮": {"type": "boolean"},
                "标签": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["商品名称", "价格"],
        },
        "fallback_values": {"是否包邮": False, "标签": []},
        "aliases": {"商品名称": ["名称", "产品名称", "product_name"], "价格": ["售价", "price"],
                    "库存": ["stock"]},
    },
    "ticket": {
        "schema": {
            "type": "object",
            "properties": {
                "category": {"enum": ["billing", "technical", "account", "other"]},
                "priority": {"type": "integer", "minimum": 1, "maximum": 5},
                "customer": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
                    "required": ["name"],
                },
                "actions": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"action": {"type": "string"},
                                       "due_days": {"type": "integer"}},
                        "required": ["action"],
                    },
                },
                "escalate": {"type": "boolean"},
            },
            "required": ["category", "priority", "customer"],
            "additionalProperties": False,
        },
        "fallback_values": {"actions": [], "escalate": False},
        "aliases": {"category": ["type", "ticket_type"], "priority": ["urgency"]},
    },
    "moderation": {
        "schema": {
            "type": "object",
            "properties": {
                "verdict": {"enum": ["allow", "review", "block"]},
                "severity": {"type": "integer", "minimum": 0, "maximum": 3},
                "reasons": {"type": "array", "items": {"type": "string"}},
                "contains_pii": {"type": "boolean"},
            },
            "required": ["verdict", "severity"],
        },
        "fallback_values": {"reasons": [], "contains_pii": False},
        "aliases": {"verdict": ["decision", "结论"], "severity": ["level", "严重程度"]},
    },
    "entities_zh": {
        "schema": {
            "type": "object",
            "properties": {
                "实体列表": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "名称": {"type": "string"},
                            "类型": {"enum": ["人物", "地点", "组织", "时间"]},
                            "置信度": {"type": "number"},
                        },
                        "required": ["名称", "类型"],
                    },
                },
                "摘要": {"type": "string"},
            },
            "required": ["实体列表"],
        },
        "fallback_values": {"摘要": ""},
        "aliases": {"实体列表": ["实体", "entities"], "摘要": ["summary", "总结"]},
    },
    "article": {
        "required_keys": ["title", "summary", "language"],
        "fallback_values": {"tags": [], "word_count": 0},
        "aliases": {"summary": ["abstract", "摘要"], "title": ["headline", "标题"]},
    },
}

RECORDS: dict[str, list[dict[str, Any]]] = {
    "sentiment": [
        {"sentiment": "positive", "score": 0.93, "keywords": ["fast delivery", "comfortable"],
         "summary": "The shoes arrived early and fit well."},
        {"sentiment": "negative", "score": 0.88, "keywords": ["noisy", "cracked lid"],
         "summary": "The blender is loud and the lid cracked after three weeks."},
        {"sentiment": "neutral", "score": 0.61, "keywords": ["average", "price"],
         "summary": "An ordinary product for the price."},
        {"sentiment": "positive", "score": 0.97, "keywords": ["物流快", "质量好"],
         "summary": "空气净化器噪音小，送货比预期早。"},
        {"sentiment": "negative", "score": 0.79, "keywords": ["空调噪音", "水压小"],
         "summary": "酒店位置好，但空调吵、淋浴水压小。"},
        {"sentiment": "positive", "score": 0.85, "keywords": ["friendly staff", "view"],
         "summary": "Friendly staff and a lovely rooftop view at sunset."},
        {"sentiment": "negative", "score": 0.92, "keywords": ["crash", "order history"],
         "summary": "The app crashes every time the order history opens."},
        {"sentiment": "neutral", "score": 0.55, "keywords": ["电池", "表带"],
         "summary": "续航不错，但表带不好换。"},
        {"sentiment": "positive", "score": 0.9, "keywords": ["easy setup"],
         "summary": "Set up in five minutes; the app connected first time."},
        {"sentiment": "negative", "score": 0.74, "keywords": ["late", "damaged box"],
         "summary": "Arrived two days late in a \"damaged\" box."},
    ],
    "product_zh": [
        {"商品名称": "小米手环8 Pro", "价格": 399, "颜色": "黑色", "库存": 120, "是否包邮": True,
         "标签": ["智能穿戴", "运动"]},
        {"商品名称": "无线降噪耳机", "价格": 899.5, "颜色": "白色", "库存": 35, "是否包邮": True,
         "标签": ["音频", "降噪"]},
        {"商品名称": "破壁料理机", "价格": 459, "颜色": "银色", "库存": 0, "是否包邮": False,
         "标签": ["厨房电器"]},
        {"商品名称": "儿童保温杯 500ml", "价格": 79.9, "颜色": "粉色", "库存": 260,
         "是否包邮": False, "标签": ["母婴", "水杯"]},
        {"商品名称": "空气净化器 AP-300", "价格": 1299, "颜色": "白色", "库存": 18,
         "是否包邮": True, "标签": ["家电", "除甲醛"]},
        {"商品名称": "机械键盘（青轴）", "价格": 329, "颜色": "灰色", "库存": 57, "是否包邮": True,
         "标签": ["电脑外设"]},
        {"商品名称": "羽绒服 男款", "价格": 1099, "颜色": "藏青色", "库存": 44, "是否包邮": True,
         "标签": ["服装", "冬季"]},
        {"商品名称": "有机绿茶 250g", "价格": 128, "颜色": "绿色", "库存": 500, "是否包邮": False,
         "标签": ["茶叶", "有机"]},
    ],
    "ticket": [
        {"category": "technical", "priority": 2,
         "customer": {"name": "Maria Lopez", "email": "maria.lopez@example.com"},
         "actions": [{"action": "send invoice PDF", "due_days": 1},
                     {"action": "escalate crash to mobile team", "due_days": 3}],
         "escalate": True},
        {"category": "billing", "priority": 3,
         "customer": {"name": "王芳", "email": "wang.fang@example.cn"},
         "actions": [{"action": "refund duplicate charge", "due_days": 2}], "escalate": False},
        {"category": "account", "priority": 4,
         "customer": {"name": "Tom Becker", "email": "tom@example.org"},
         "actions": [{"action": "reset two-factor login", "due_days": 1}], "escalate": False},
        {"category": "other", "priority": 5,
         "customer": {"name": "李雷", "email": "lilei@example.cn"},
         "actions": [{"action": "forward feedback to product team", "due_days": 7}],
         "escalate": False},
        {"category": "technical", "priority": 1,
         "customer": {"name": "Priya Shah", "email": "priya.shah@example.in"},
         "actions": [{"action": "restore deleted project", "due_days": 0},
                     {"action": "post incident report", "due_days": 2}],
         "escalate": True},
        {"category": "billing", "priority": 2,
         "customer": {"name": "Jean Martin", "email": "jean.martin@example.fr"},
         "actions": [{"action": "correct VAT number on invoice", "due_days": 3}],
         "escalate": False},
    ],
    "moderation": [
        {"verdict": "allow", "severity": 0, "reasons": [], "contains_pii": False},
        {"verdict": "block", "severity": 3, "reasons": ["hate speech", "threat"],
         "contains_pii": False},
        {"verdict": "review", "severity": 2, "reasons": ["包含手机号", "疑似广告"],
         "contains_pii": True},
        {"verdict": "review", "severity": 1, "reasons": ["possible spam link"],
         "contains_pii": False},
        {"verdict": "block", "severity": 3, "reasons": ["诈骗信息"], "contains_pii": True},
        {"verdict": "allow", "severity": 1, "reasons": ["mild profanity"], "contains_pii": False},
        {"verdict": "review", "severity": 2, "reasons": ["home address shared"],
         "contains_pii": True},
    ],
    "entities_zh": [
        {"实体列表": [{"名称": "李伟", "类型": "人物", "置信度": 0.98},
                  {"名称": "上海", "类型": "地点", "置信度": 0.95}],
         "摘要": "李伟下周将在上海参加发布会。"},
        {"实体列表": [{"名称": "华东区", "类型": "地点", "置信度": 0.9},
                  {"名称": "双十一", "类型": "时间", "置信度": 0.87}],
         "摘要": "双十一期间华东区销量占比最高。"},
        {"实体列表": [{"名称": "气象台", "类型": "组织", "置信度": 0.93}],
         "摘要": "气象台发布暴雨橙色预警。"},
        {"实体列表": [{"名称": "Sarah", "类型": "人物", "置信度": 0.91},
                  {"名称": "法务部", "类型": "组织", "置信度": 0.88},
                  {"名称": "周四", "类型": "时间", "置信度": 0.8}],
         "摘要": "Sarah 与法务部将在周四讨论合同条款。"},
        {"实体列表": [{"名称": "北京", "类型": "地点", "置信度": 0.99}],
         "摘要": "北京明日有小雨。"},
        {"实体列表": [{"名称": "张三", "类型": "人物", "置信度": 0.97},
                  {"名称": "腾讯", "类型": "组织", "置信度": 0.96}],
         "摘要": "张三已加入腾讯。"},
    ],
    "article": [
        {"title": "Heavy rain expected in the north", "summary":
         "Flood warnings, three shelters opened, reduced train timetable until Monday.",
         "language": "en", "tags": ["weather", "flood"], "word_count": 96},
        {"title": "季度营收增长百分之十二", "summary": "海外订单带动增长，董事会决定派发现金红利。",
         "language": "zh", "tags": ["财报"], "word_count": 210},
        {"title": "Morning exercise and sleep", "summary":
         "Morning exercisers fell asleep 11 minutes faster; a randomised trial is planned.",
         "language": "en", "tags": ["health", "sleep"], "word_count": 88},
        {"title": "新规：跨团队代码审查",
         "summary": "每个合并请求需其他团队工程师审查，一个工作日内回复。",
         "language": "zh", "tags": ["工程", "流程"], "word_count": 150},
        {"title": "Warehouse lease draft", "summary":
         "Five-year term from 1 July; clause 14 on early termination needs discussion.",
         "language": "en", "tags": ["legal"], "word_count": 120},
        {"title": "密码重置流程", "summary": "通过短信验证码重置密码，验证码十分钟内有效。",
         "language": "zh", "tags": ["账号", "安全"], "word_count": 130},
    ],
}

PREFIXES = [
    "Sure! Here is the JSON you asked for:\n",
    "Here's the analysis:\n\n",
    "Certainly. Based on the input, the result is:\n",
    "好的，以下是结果：\n",
    "根据您提供的内容，分析结果如下：\n",
    "Output:\n",
    "I've analysed the text. The structured result is below.\n\n",
]
SUFFIXES = [
    "\n\nLet me know if you need anything else!",
    "\n\nNote: the score is an estimate based on the wording of the review.",
    "\n\n希望对您有帮助！",
    "\n\nI hope this helps. (Fields follow the schema you provided.)",
    "\n\n如有需要，我可以进一步解释。",
]
REFUSALS = [
    "I'm sorry, but I can't help with that request.",
    "抱歉，我无法处理这个请求。",
    "As an AI language model, I cannot provide that information.",
    "The review is clearly positive overall, with a high confidence of about 0.9.",
    "这条评论整体是正面的，主要提到了物流快和质量好。",
    "I need more context to answer. Could you share the full text?",
    "",
    "   \n  ",
]
NOISE = [
    "{{{{ ]]] ::",
    "{\"sent",
    "```json\n{\n```",
    "{ ... }",
    "Result: { see above }",
    "{\n  \"",
    "[",
]


def _dump(value: Any, rng: random.Random, indent: bool | None = None) -> str:
    if indent is None:
        indent = rng.random() < 0.5
    return json.dumps(value, ensure_ascii=False, indent=2 if indent else None)


def _rule_props(rule: dict[str, Any]) -> list[str]:
    if "schema" in rule:
        return list(rule["schema"]["properties"])
    return [*rule["required_keys"], *rule["fallback_values"]]


def _required(rule: dict[str, Any]) -> list[str]:
    if "schema" in rule:
        return list(rule["schema"]["required"])
    return list(rule["required_keys"])


def _misspell(key: str, rng: random.Random) -> str | None:
    if any("\u4e00" <= c <= "\u9fff" for c in key):
        return key[:-1] if len(key) >= 4 else None
    if len(key) < 5:
        return None
    i = rng.randrange(1, len(key) - 2)
    if rng.random() < 0.5:
        return key[:i] + key[i + 1] + key[i] + key[i + 2:]  # transposition
    return key[:i] + key[i + 1:]  # deletion


def _recase(key: str, rng: random.Random) -> str | None:
    if not key.isascii():
        return None
    parts = key.split("_")
    style = rng.choice(["title", "upper", "camel"])
    if style == "title":
        return "_".join(p.capitalize() for p in parts)
    if style == "upper":
        return key.upper()
    out = parts[0] + "".join(p.capitalize() for p in parts[1:])
    return out if out != key else key.capitalize()


def _rename(record: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    return {(new if k == old else k): v for k, v in record.items()}


def _stringify(value: Any, rng: random.Random) -> Any:
    if isinstance(value, bool):
        return rng.choice(["true", "True", "yes", "是"] if value else ["false", "no", "否"])
    if isinstance(value, int | float):
        return str(value)
    return value


def _case(cases: list[dict[str, Any]], rule: str, kind: str, raw: str, status: list[str],
          value: Any = None, required: list[str] | None = None, usable: bool = True) -> None:
    expect: dict[str, Any] = {"usable": usable, "status": status}
    if value is not None:
        expect["value"] = value
    if required is not None:
        expect["required"] = required
    cases.append({"rule": rule, "kind": kind, "raw": raw, "expect": expect})


def _usable_cases(rule_name: str, rule: dict[str, Any], record: dict[str, Any],
                  rng: random.Random, cases: list[dict[str, Any]]) -> None:
    props = _rule_props(rule)
    required = _required(rule)
    text = _dump(record, rng)
    _case(cases, rule_name, "clean", text, ["valid"], record)
    _case(cases, rule_name, "fenced", f"```json\n{_dump(record, rng, True)}\n```",
          ["repaired"], record)
    _case(cases, rule_name, "fenced_chatty",
          f"{rng.choice(PREFIXES)}```\n{text}\n```{rng.choice(SUFFIXES)}", ["repaired"], record)
    _case(cases, rule_name, "chatty", f"{rng.choice(PREFIXES)}{text}{rng.choice(SUFFIXES)}",
          ["repaired"], record)
    compact = json.dumps(record, ensure_ascii=False)
    trailing = compact.replace("]", ",]", 1)[:-1] + ",}"
    _case(cases, rule_name, "trailing_comma", trailing, ["repaired"], record)
    _case(cases, rule_name, "python_dict", repr(record), ["repaired"], record)
    unquoted = compact
    for k in props:
        if k.isidentifier():
            unquoted = unquoted.replace(f'"{k}":', f"{k}:")
    if unquoted != compact:
        _case(cases, rule_name, "unquoted_keys", unquoted, ["repaired"], record)
    commented = text.replace("\n", " // model note\n", 1) if "\n" in text else \
        "// generated\n" + text
    _case(cases, rule_name, "comments", commented, ["repaired"], record)
    # field names
    key = rng.choice([k for k in props if k in record])
    bad = _misspell(key, rng)
    if bad and bad not in props:
        _case(cases, rule_name, "misspelled_key", _dump(_rename(record, key, bad), rng),
              ["repaired"], record)
    aliases = rule.get("aliases", {})
    canon = rng.choice(sorted(aliases))
    if canon in record:
        alias = rng.choice(aliases[canon])
        _case(cases, rule_name, "alias_key", _dump(_rename(record, canon, alias), rng),
              ["repaired"], record)
    recased = {(_recase(k, rng) or k): v for k, v in record.items()}
    if recased != record:
        _case(cases, rule_name, "recased_keys", _dump(recased, rng), ["repaired"], record)
    # types
    stringified = {k: _stringify(v, rng) for k, v in record.items()}
    if stringified != record:
        _case(cases, rule_name, "wrong_types", _dump(stringified, rng), ["coerced"], record)
    enum_keys = [k for k in props if "enum" in rule.get("schema", {}).get("properties", {})
                 .get(k, {})]
    if enum_keys and record.get(enum_keys[0]):
        changed = dict(record)
        changed[enum_keys[0]] = str(record[enum_keys[0]]).upper()
        _case(cases, rule_name, "enum_case", _dump(changed, rng), ["coerced"], record)
    # missing and extra fields
    fallbacks = rule.get("fallback_values", {})
    droppable = [k for k in fallbacks if k in record]
    if droppable:
        k = rng.choice(droppable)
        dropped = {kk: v for kk, v in record.items() if kk != k}
        expected = dict(record)
        expected[k] = fallbacks[k]
        _case(cases, rule_name, "missing_field", _dump(dropped, rng), ["filled_fallback"],
              expected)
    extra = dict(record)
    extra["explanation" if rng.random() < 0.5 else "备注"] = "Based on the key phrases."
    closed = rule.get("schema", {}).get("additionalProperties") is False
    _case(cases, rule_name, "extra_field", _dump(extra, rng),
          ["repaired"] if closed else ["valid"], record if closed else extra)
    # wrappers
    _case(cases, rule_name, "double_encoded", json.dumps(compact, ensure_ascii=False),
          ["repaired"], record)
    _case(cases, rule_name, "wrapped_in_array", f"[{compact}]", ["repaired"], record)
    # truncated in the last field, after every required field
    ordered = {k: record[k] for k in [*required, *[p for p in record if p not in required]]}
    last = list(ordered)[-1]
    if last not in required and isinstance(ordered[last], str | list) and ordered[last]:
        full = json.dumps(ordered, ensure_ascii=False)
        cut = full.rfind(json.dumps(ordered[last], ensure_ascii=False)[:2]) + \
            max(3, len(json.dumps(ordered[last], ensure_ascii=False)) // 2)
        _case(cases, rule_name, "truncated", full[:cut], ["repaired", "filled_fallback"],
              required=required)
    # combinations
    combo = _rename(stringified, key, bad) if bad and bad not in props else stringified
    if combo != record:
        _case(cases, rule_name, "fenced_misspelled_types",
              f"{rng.choice(PREFIXES)}```json\n{_dump(combo, rng)}\n```",
              ["coerced"] if stringified != record else ["repaired"], record)


def _unusable_cases(rule_name: str, rule: dict[str, Any], record: dict[str, Any],
                    rng: random.Random, cases: list[dict[str, Any]]) -> None:
    required = _required(rule)
    fallbacks = rule.get("fallback_values", {})
    hard = [k for k in required if k not in fallbacks]
    if hard:
        k = rng.choice(hard)
        dropped = {kk: v for kk, v in record.items() if kk != k}
        _case(cases, rule_name, "missing_required", _dump(dropped, rng), ["schema_violation"],
              usable=False)
    props = rule.get("schema", {}).get("properties", {})
    numeric = [k for k in hard if props.get(k, {}).get("type") in ("number", "integer")]
    if numeric:
        broken = dict(record)
        broken[numeric[0]] = rng.choice(["very high", "高", "N/A?", "about three"])
        _case(cases, rule_name, "uncoercible_type", _dump(broken, rng), ["schema_violation"],
              usable=False)
    enums = [k for k in hard if "enum" in props.get(k, {})]
    if enums:
        broken = dict(record)
        broken[enums[0]] = rng.choice(["mixed", "unknown", "不确定"])
        _case(cases, rule_name, "bad_enum", _dump(broken, rng), ["schema_violation"],
              usable=False)


def build() -> list[dict[str, Any]]:
    rng = random.Random(20240601)
    cases: list[dict[str, Any]] = []
    for rule_name, records in RECORDS.items():
        rule = RULES[rule_name]
        for record in records:
            _usable_cases(rule_name, rule, copy.deepcopy(record), rng, cases)
            if rng.random() < 0.6:
                _unusable_cases(rule_name, rule, copy.deepcopy(record), rng, cases)
        for text in REFUSALS:
            _case(cases, rule_name, "refusal", text, ["no_json_found"], usable=False)
        for text in NOISE:
            _case(cases, rule_name, "noise", text, ["invalid_json"], usable=False)
        early = json.dumps(records[0], ensure_ascii=False)[:6]
        _case(cases, rule_name, "truncated_early", early, ["invalid_json"], usable=False)
        _case(cases, rule_name, "array_of_scalars", json.dumps(["positive", 0.9]),
              ["schema_violation"], usable=False)
    for i, case in enumerate(cases):
        case["id"] = f"{case['rule']}-{i:04d}-{case['kind']}"
    return cases


# --- Part two: outputs of the kinds the ladder used to get wrong ---------------------
#
# Fallbacks of "" and null, outputs from which no declared field can be recovered,
# wrappers of any depth, full-width punctuation and curly quotes used as JSON syntax,
# several objects in one reply, and truncation inside values, keys and wrappers; in
# English and Chinese, on four rules with enums, integer ranges, free text, Chinese
# keys, aliases and fallbacks (one rule with a fallback for every field, one that keeps
# cut values). Its own seed, appended after part one so that part one's ids stay.
# Expected values are derived from the records and the mutation, never from the ladder.

GAP_RULES: dict[str, dict[str, Any]] = {
    "complaint_zh": {
        "schema": {
            "type": "object",
            "properties": {
                "category": {"enum": ["物流", "质量", "服务", "价格", "其他"]},
                "severity": {"type": "integer", "minimum": 1, "maximum": 5},
                "summary": {"type": "string", "maxLength": 200},
            },
            "required": ["category", "severity", "summary"],
        },
        "fallback_values": {"summary": "", "severity": 3},
        "aliases": {"category": ["类别", "分类", "complaint_type"],
                    "severity": ["严重程度", "等级"], "summary": ["摘要", "概述"]},
    },
    "log_zh": {
        "schema": {
            "type": "object",
            "properties": {
                "级别": {"enum": ["调试", "信息", "警告", "错误", "致命"]},
                "模块": {"type": "string", "minLength": 1},
                "原因": {"type": "string"},
                "需要告警": {"type": "boolean"},
                "重复次数": {"type": "integer", "minimum": 0},
            },
            "required": ["级别", "模块", "原因"],
            "additionalProperties": False,
        },
        "fallback_values": {"原因": "", "需要告警": False, "重复次数": 0},
        "aliases": {"级别": ["level", "日志级别"], "模块": ["module", "组件"],
                    "原因": ["reason", "cause", "根因"], "需要告警": ["alert", "告警"]},
    },
    "verdict": {
        "schema": {
            "type": "object",
            "properties": {
                "risk_level": {"enum": ["safe", "borderline", "unsafe"]},
                "action": {"enum": ["allow", "review", "remove"]},
                "reason": {"type": "string"},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                "categories": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["risk_level", "action", "reason"],
        },
        "fallback_values": {"risk_level": "borderline", "action": "review", "reason": "",
                            "confidence": None, "categories": []},
        "aliases": {"risk_level": ["风险等级", "risk"], "action": ["处理", "decision"],
                    "reason": ["explanation", "理由", "why"]},
    },
    "yes_no": {
        "schema": {
            "type": "object",
            "properties": {"answer": {"enum": ["yes", "no"]}, "note": {"type": "string"}},
            "required": ["answer", "note"],
        },
        "fallback_values": {"note": ""},
        "aliases": {"answer": ["回答", "结论", "reply"], "note": ["备注", "comment"]},
    },
}
GAP_RULES["verdict_keep_cut"] = {**copy.deepcopy(GAP_RULES["verdict"]), "keep_truncated": True}
RULES.update(GAP_RULES)

GAP_RECORDS: dict[str, list[dict[str, Any]]] = {
    "complaint_zh": [
        {"category": "物流", "severity": 4, "summary": "快递延误五天，客服一直没有回复。"},
        {"category": "质量", "severity": 5,
         "summary": "收到的电水壶底座漏电，差点烫伤孩子。"},
        {"category": "服务", "severity": 2, "summary": "客服态度冷淡，说“这不归我们管”。"},
        {"category": "价格", "severity": 3,
         "summary": "下单第二天就降价：差价 80 元，申请价保被拒。"},
        {"category": "其他", "severity": 1, "summary": "希望 App 增加夜间模式。"},
        {"category": "物流", "severity": 3,
         "summary": "The parcel arrived opened, one item missing."},
        {"category": "质量", "severity": 4, "summary": "鞋底开胶（穿了不到一周），要求退货。"},
        {"category": "服务", "severity": 5,
         "summary": "Refund promised three times, still nothing; customer says \"I will sue\"."},
    ],
    "log_zh": [
        {"级别": "错误", "模块": "支付网关", "原因": "上游超时：30 秒无响应",
         "需要告警": True, "重复次数": 12},
        {"级别": "警告", "模块": "订单服务", "原因": "库存接口返回 429，已自动重试",
         "需要告警": False, "重复次数": 3},
        {"级别": "致命", "模块": "数据库连接池", "原因": "连接耗尽（max=100），新请求全部失败",
         "需要告警": True, "重复次数": 1},
        {"级别": "信息", "模块": "调度器", "原因": "定时任务 nightly-report 已完成",
         "需要告警": False, "重复次数": 0},
        {"级别": "调试", "模块": "auth-service", "原因": "token refreshed for user 42",
         "需要告警": False, "重复次数": 0},
        {"级别": "错误", "模块": "search-indexer",
         "原因": "disk full on /var/lib/index, writes rejected", "需要告警": True, "重复次数": 57},
        {"级别": "警告", "模块": "网关", "原因": "证书将在 7 天后过期", "需要告警": True,
         "重复次数": 1},
        {"级别": "错误", "模块": "消息队列", "原因": "消费者“order-sync”落后 12 万条",
         "需要告警": True, "重复次数": 4},
    ],
    "verdict": [
        {"risk_level": "safe", "action": "allow", "reason": "Ordinary product question.",
         "confidence": 0.97, "categories": []},
        {"risk_level": "unsafe", "action": "remove",
         "reason": "Threatens violence against a named person.", "confidence": 0.93,
         "categories": ["violence", "harassment"]},
        {"risk_level": "borderline", "action": "review",
         "reason": "含有疑似广告链接，但上下文是用户求助。", "confidence": 0.61,
         "categories": ["spam"]},
        {"risk_level": "unsafe", "action": "remove", "reason": "发布他人手机号和家庭住址。",
         "confidence": 0.88, "categories": ["privacy"]},
        {"risk_level": "safe", "action": "allow", "reason": "引用新闻报道，无攻击性内容。",
         "confidence": 0.9, "categories": []},
        {"risk_level": "borderline", "action": "review",
         "reason": "Sarcastic insult; could be read as a joke.", "confidence": 0.55,
         "categories": ["harassment"]},
        {"risk_level": "unsafe", "action": "remove",
         "reason": "Sells counterfeit medicine: \"no prescription needed\".", "confidence": 0.95,
         "categories": ["fraud", "illegal goods"]},
        {"risk_level": "safe", "action": "allow", "reason": "用户说：“谢谢，问题解决了”。",
         "confidence": 0.99, "categories": []},
    ],
    "yes_no": [
        {"answer": "yes", "note": "The order shipped on 3 May."},
        {"answer": "no", "note": "用户没有提供订单号。"},
        {"answer": "yes", "note": "合同第 14 条允许提前解约，但需提前 30 天通知。"},
        {"answer": "no", "note": "The warranty ended in March; repairs are paid."},
        {"answer": "yes", "note": "发票抬头可以修改，一次为限。"},
        {"answer": "no", "note": "Not stated in the text."},
        {"answer": "yes", "note": "支持，货到付款仅限大陆地区。"},
        {"answer": "no", "note": "The customer asked for a refund, not an exchange."},
    ],
}

WRAPPERS = ["result", "data", "output", "payload", "response", "输出", "结果", "答案", "分析",
            "classification", "json"]
META = [{"model": "gpt-x", "ms": 12}, {"ok": True}, {"status": "success", "version": 2},
        {"耗时": "35ms"}, {"confidence_note": "high", "tokens": 187}]
LEADS = ["Here is the result:\n", "好的，结果如下：\n", "Analysis complete. ",
         "根据日志内容，判断如下：", "", "Sure!\n\n"]
TAILS = ["", "\n\nLet me know if you need more.", "\n以上。", " (generated automatically)",
         "\n\n注：仅供参考。"]
BETWEEN = ["\n", "\n\nAnother possible result:\n", "\n或者也可能是：", " Alternatively: ",
           "\n\n如果按更严格的标准：\n"]


def _fields(rule: dict[str, Any]) -> dict[str, dict[str, Any]]:
    props: dict[str, dict[str, Any]] = rule["schema"]["properties"]
    return props


def _with(record: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = dict(record)
    out.update(changes)
    return out


def _fullwidth(record: dict[str, Any], rng: random.Random, style: str) -> str:
    """The record written with full-width syntax: ``all`` (curly quotes, ``：，｛｝［］``),
    ``punct`` (ASCII quotes, full-width ``：，``), ``braces`` (``｛｝`` only) or ``mixed``
    (each syntax character drawn at random)."""
    def pick(ascii_form: str, wide: str) -> str:
        if style == "all":
            return wide
        if style == "mixed":
            return rng.choice([ascii_form, wide])
        if style == "punct":
            return wide if ascii_form in ":," else ascii_form
        return wide if ascii_form in "{}[]" else ascii_form

    def string(s: str) -> str:
        q = pick('"', "“")
        if q == "“":
            return f"“{s}”"  # a model writing curly quotes does not escape ASCII ones
        return json.dumps(s, ensure_ascii=False)

    def value(v: Any) -> str:
        if isinstance(v, str):
            return string(v)
        if isinstance(v, list):
            sep = pick(",", "，")
            return pick("[", "［") + sep.join(value(x) for x in v) + pick("]", "］")
        return json.dumps(v)

    colon_space = rng.choice(["", " "])
    items = [f"{string(k)}{pick(':', '：')}{colon_space}{value(v)}" for k, v in record.items()]
    return pick("{", "｛") + pick(",", "，").join(items) + pick("}", "｝")


def _ordered(record: dict[str, Any], last: str) -> dict[str, Any]:
    out = {k: v for k, v in record.items() if k != last}
    out[last] = record[last]
    return out


def _cut_inside(record: dict[str, Any], field: str, rng: random.Random) -> str:
    """The record serialised with ``field`` last, cut inside that field's string value."""
    text = json.dumps(_ordered(record, field), ensure_ascii=False)
    body = json.dumps(record[field], ensure_ascii=False)
    start = text.rindex(body)
    return text[:start + rng.randrange(1, len(body) - 1)]


def _expected(rule: dict[str, Any], record: dict[str, Any], drop: tuple[str, ...] = ()) -> Any:
    """The record with ``drop`` removed and fallbacks filled, or None when a required
    field without fallback is gone."""
    out = {k: v for k, v in record.items() if k not in drop}
    required = rule["schema"]["required"]
    for k in drop:
        if k in rule["fallback_values"]:
            out[k] = rule["fallback_values"][k]
        elif k in required:
            return None
    return out


def _gap_fallbacks(name: str, rule: dict[str, Any], record: dict[str, Any],
                   rng: random.Random, cases: list[dict[str, Any]]) -> None:
    fallbacks = rule["fallback_values"]
    required = rule["schema"]["required"]
    with_fb = [k for k in record if k in fallbacks]
    k = rng.choice(with_fb)
    expected = _expected(rule, record, (k,))
    dropped = {kk: v for kk, v in record.items() if kk != k}
    _case(cases, name, "fallback_missing", _dump(dropped, rng), ["filled_fallback"], expected)
    k = rng.choice(with_fb)
    _case(cases, name, "fallback_null", _dump(_with(record, **{k: None}), rng),
          ["filled_fallback"], _expected(rule, record, (k,)))
    empty_ok = [kk for kk in with_fb if kk in required and isinstance(record[kk], str)]
    if empty_ok:
        k = rng.choice(empty_ok)
        _case(cases, name, "fallback_empty_required", _dump(_with(record, **{k: ""}), rng),
              ["filled_fallback"], _expected(rule, record, (k,)))
    hard = [kk for kk in required if kk not in fallbacks]
    if hard:
        k = rng.choice(hard)
        dropped = {kk: v for kk, v in record.items() if kk != k}
        _case(cases, name, "fallback_none_declared", _dump(dropped, rng),
              ["schema_violation"], usable=False)
    # every field with a fallback missing at once: still the model's answer if one of
    # its own fields is there
    kept = [kk for kk in record if kk not in fallbacks]
    if kept:
        only = {kk: record[kk] for kk in kept}
        _case(cases, name, "fallback_all_missing", _dump(only, rng), ["filled_fallback"],
              _expected(rule, record, tuple(with_fb)))


def _gap_nothing(name: str, rule: dict[str, Any], record: dict[str, Any],
                 rng: random.Random, cases: list[dict[str, Any]]) -> None:
    unknown = rng.choice([{"text": "用户反馈内容", "lang": "zh"}, {"foo": "bar"},
                          {"input": record.get("summary", "x"), "id": 7},
                          {"描述": "无法判断", "备选": ["a", "b"]}])
    depth = rng.randint(1, 3)
    wrapped: Any = unknown
    for w in rng.sample(WRAPPERS, depth):
        wrapped = {w: wrapped}
    _case(cases, name, "nothing_wrapped", _dump(wrapped, rng), ["schema_violation"],
          usable=False)
    meta = {rng.choice(WRAPPERS): unknown, **rng.choice(META)}
    _case(cases, name, "nothing_beside_meta", _dump(meta, rng), ["schema_violation"],
          usable=False)
    _case(cases, name, "nothing_unknown_keys", _dump(unknown, rng), ["schema_violation"],
          usable=False)
    blank = {k: rng.choice([None, "", "  "]) for k in record}
    _case(cases, name, "nothing_blank", _dump(blank, rng), ["schema_violation"],
          usable=False)
    first_key = json.dumps(next(iter(record)), ensure_ascii=False)
    cut = "{" + first_key + ": " + json.dumps(record[next(iter(record))],
                                              ensure_ascii=False)[:2]
    _case(cases, name, "nothing_cut_first_value", rng.choice(LEADS) + cut, ["invalid_json"],
          usable=False)


def _gap_wrappers(name: str, rule: dict[str, Any], record: dict[str, Any],
                  rng: random.Random, cases: list[dict[str, Any]]) -> None:
    depth = rng.randint(1, 4)
    wrapped: Any = record
    for w in rng.sample(WRAPPERS, depth):
        wrapped = {w: wrapped}
    _case(cases, name, "wrapped_single", _dump(wrapped, rng), ["repaired"], record)
    beside = {**rng.choice(META), rng.choice(WRAPPERS): record}
    if rng.random() < 0.5:
        beside = {rng.choice(WRAPPERS): record, **rng.choice(META)}
    _case(cases, name, "wrapped_beside_meta", _dump(beside, rng), ["repaired"], record)
    deep = {rng.choice(WRAPPERS): {rng.choice(["answer_json", "内容"]): record},
            **rng.choice(META)}
    _case(cases, name, "wrapped_deep_meta",
          rng.choice(LEADS) + _dump(deep, rng) + rng.choice(TAILS), ["repaired"], record)
    as_text = {rng.choice(WRAPPERS): json.dumps(record, ensure_ascii=False)}
    _case(cases, name, "wrapped_string", _dump(as_text, rng), ["repaired"], record)
    as_list = {rng.choice(WRAPPERS): [record]}
    _case(cases, name, "wrapped_list", _dump(as_list, rng), ["repaired"], record)
    aliases = rule["aliases"]
    canon = rng.choice(sorted(k for k in aliases if k in record))
    renamed = _rename(record, canon, rng.choice(aliases[canon]))
    _case(cases, name, "wrapped_alias", _dump({rng.choice(WRAPPERS): renamed}, rng),
          ["repaired"], record)
    # a wrapper that bears the alias of a field which is never an object
    scalar = [k for k in aliases if "enum" in _fields(rule)[k]]
    named = rng.choice(aliases[rng.choice(scalar)])
    _case(cases, name, "wrapped_named_like_field", _dump({named: record}, rng), ["repaired"],
          record)


def _gap_fullwidth(name: str, rule: dict[str, Any], record: dict[str, Any],
                   rng: random.Random, cases: list[dict[str, Any]]) -> None:
    for style in ("all", "punct", "braces", "mixed"):
        _case(cases, name, f"fullwidth_{style}", _fullwidth(record, rng, style), ["repaired"],
              record)
    _case(cases, name, "fullwidth_chatty",
          rng.choice(LEADS) + _fullwidth(record, rng, "all") + rng.choice(TAILS),
          ["repaired"], record)
    _case(cases, name, "fullwidth_fenced",
          f"```json\n{_fullwidth(record, rng, rng.choice(['all', 'mixed']))}\n```",
          ["repaired"], record)


def _placeholder(rule: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, spec in _fields(rule).items():
        if "enum" in spec:
            out[k] = "|".join(spec["enum"])
        elif spec.get("type") == "integer":
            out[k] = f"{spec.get('minimum', 0)}-{spec.get('maximum', 9)}"
        else:
            out[k] = "..."
    return out


def _gap_several(name: str, rule: dict[str, Any], record: dict[str, Any],
                 other: dict[str, Any], rng: random.Random, cases: list[dict[str, Any]]) -> None:
    compact = json.dumps(record, ensure_ascii=False)
    second = json.dumps(other, ensure_ascii=False)
    _case(cases, name, "several_array", f"[{compact}, {second}]", ["repaired"], record)
    _case(cases, name, "several_array_chatty",
          rng.choice(LEADS) + _dump([record, other], rng, True) + rng.choice(TAILS),
          ["repaired"], record)
    _case(cases, name, "several_in_a_row", compact + rng.choice(BETWEEN) + second,
          ["repaired"], record)
    _case(cases, name, "several_then_cut", compact + rng.choice(BETWEEN) + second[:-7],
          ["repaired"], record)
    # the model starts over after an answer it did not finish: the complete one counts
    restart = _cut_inside(other, rng.choice([k for k, v in other.items()
                                             if isinstance(v, str) and len(v) >= 4]), rng)
    _case(cases, name, "several_cut_then_complete",
          restart + rng.choice(["\n", "\n\n", "\n重新输出：\n", "\nLet me redo that: "])
          + compact, ["repaired"], record)
    if not all(k in rule["fallback_values"] for k in _fields(rule)):
        # a template first: not an answer (its enum placeholder breaks the schema)
        _case(cases, name, "several_template_first",
              "Format: " + json.dumps(_placeholder(rule), ensure_ascii=False) + "\n" + compact,
              ["repaired"], record)


def _gap_truncation(name: str, rule: dict[str, Any], record: dict[str, Any],
                    rng: random.Random, cases: list[dict[str, Any]]) -> None:
    fields = _fields(rule)
    strings = [k for k, v in record.items() if isinstance(v, str) and len(v) >= 4
               and "enum" not in fields[k]]
    enums = [k for k in record if "enum" in fields[k] and len(record[k]) >= 2]
    for kind, pool in (("cut_in_string", strings), ("cut_in_enum", enums)):
        k = rng.choice(pool)
        expected = _expected(rule, record, (k,))
        raw = rng.choice(LEADS) + _cut_inside(record, k, rng)
        if expected is None:
            _case(cases, name, kind, raw, ["schema_violation"], usable=False)
        else:
            _case(cases, name, kind, raw, ["filled_fallback"], expected)
    text = json.dumps(_ordered(record, rng.choice(strings)), ensure_ascii=False)
    _case(cases, name, "cut_before_brace", text[:-1], ["repaired"], record)
    cut_key = text[:-1] + ', "' + rng.choice(["detai", "explan", "备", "confid"])
    _case(cases, name, "cut_in_key", cut_key, ["repaired"], record)
    wrapper = rng.choice(WRAPPERS)
    inside = '{"' + wrapper + '": ' + text[:-1] + ', "' + rng.choice(["detai", "not", "附"])
    _case(cases, name, "cut_in_wrapper", inside, ["repaired"], record)
    wrapped_cut = '{"' + wrapper + '": ' + text + ', "model": "gpt'
    _case(cases, name, "cut_after_wrapper", wrapped_cut, ["repaired"], record)
    ints = [k for k, v in record.items() if isinstance(v, int) and not isinstance(v, bool)]
    if ints:
        k = rng.choice(ints)
        ordered = json.dumps(_ordered(record, k), ensure_ascii=False)
        expected = _expected(rule, record, (k,))
        status = ["filled_fallback"] if expected is not None else ["schema_violation"]
        _case(cases, name, "cut_after_number", ordered[:-1], status, expected,
              usable=expected is not None)
    k = rng.choice(strings)
    expected = _expected(rule, record, (k,))
    _case(cases, name, "cut_fenced", "```json\n" + _cut_inside(record, k, rng),
          ["filled_fallback"] if expected is not None else ["schema_violation"], expected,
          usable=expected is not None)


def _gap_keep_cut(record: dict[str, Any], rng: random.Random,
                  cases: list[dict[str, Any]]) -> None:
    """The rule that keeps cut values: the cut string is delivered as it stands."""
    text = json.dumps(_ordered(record, "reason"), ensure_ascii=False)
    body = json.dumps(record["reason"], ensure_ascii=False)
    start = text.rindex(body)
    cut = rng.randrange(3, len(body) - 1)
    raw = text[:start + cut]
    partial = json.loads(body[:cut] + '"')
    _case(cases, "verdict_keep_cut", "cut_kept", raw, ["repaired"],
          _with(_ordered(record, "reason"), reason=partial))


def build_gaps() -> list[dict[str, Any]]:
    rng = random.Random(20250317)
    cases: list[dict[str, Any]] = []
    for name, records in GAP_RECORDS.items():
        rule = GAP_RULES[name]
        for i, record in enumerate(records):
            other = records[(i + 3) % len(records)]
            _gap_fallbacks(name, rule, record, rng, cases)
            _gap_nothing(name, rule, record, rng, cases)
            _gap_wrappers(name, rule, record, rng, cases)
            _gap_fullwidth(name, rule, record, rng, cases)
            _gap_several(name, rule, record, other, rng, cases)
            _gap_truncation(name, rule, record, rng, cases)
    for record in GAP_RECORDS["verdict"]:
        _gap_keep_cut(record, rng, cases)
    return cases


def main() -> None:
    cases = build()
    gaps = build_gaps()
    for i, case in enumerate(gaps, start=len(cases)):
        case["id"] = f"{case['rule']}-{i:04d}-{case['kind']}"
    cases += gaps
    (HERE / "rules.json").write_text(json.dumps(RULES, ensure_ascii=False, indent=2) + "\n",
                                     encoding="utf-8")
    with (HERE / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for case in cases:
            f.write(json.dumps({k: case[k] for k in ("id", "rule", "kind", "raw", "expect")},
                               ensure_ascii=False) + "\n")
    print(f"{len(cases)} cases")


if __name__ == "__main__":
    main()
