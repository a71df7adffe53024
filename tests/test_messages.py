"""What the user reads: a fix that fits what was found, numbers that stay readable, a docs
example for every code.

(The checker-accuracy tests that were here, each a miss, a false alarm or a wrong fix, are
in their codes' files: `tests/test_lgNNN_<slug>.py`.)
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

import lora_guard as lg
from conftest_adapters import llama, save
from lora_guard._core.errors import make_violation
from lora_guard._frontends.cli import main

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from peft import LoraConfig  # noqa: E402

# These tests provoke violations on purpose and assert them: under `pytest --lora-guard`,
# the ones the checker returns in a Report are not raised; the integration's are raised
# and caught with pytest.raises.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_the_cli_prints_the_fix_for_what_was_found(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = save(llama(), LoraConfig(r=8, target_modules=["q_proj"]), tmp_path / "r8")
    assert main(["check", str(folder), "--allowed-ranks", "4,16"]) == 1
    out = capsys.readouterr().out
    assert "not one of the served ranks [4, 16]" in out and "--allowed-ranks" in out


def test_a_dtype_violation_is_recorded_once_and_its_fix_is_about_dtypes() -> None:
    @lg.shapes(a="n r", dtypes=("float32",))
    def set_lora(a: Any) -> None: ...

    with lg.recording() as rec, pytest.raises(lg.ShapeContractError) as caught:
        set_lora(torch.zeros(2, 3, dtype=torch.float16))

    assert [v.code for v in rec.violations] == ["LG004"]
    assert "has dtype float16, but the guard allows ['float32']" in str(caught.value)
    assert "dtype" in caught.value.hint and "shapes match" not in caught.value.hint


def test_numbers_thousands_of_digits_long_are_shortened_in_messages() -> None:
    v = make_violation("LG109", "layer", "adapter 'a'", key="k", layer=10**4000, layers=2)
    assert "10000...0000 (4,001 digits)" in v.message and len(v.message) < 200
    past_the_limit = make_violation("LG101", "max", "adapter 'a'", rank=10**5000,
                                    module="m", max_rank=16)
    assert "an integer of about 5,000 digits" in past_the_limit.message


@pytest.mark.parametrize("code", list(lg.INVARIANTS))
def test_the_docs_page_of_each_code_shows_a_real_example_of_its_output(code: str) -> None:
    """The reference page of a code (`lora-guard explain CODE`) shows what the user sees:
    an example that prints a line carrying the code."""
    inv = lg.INVARIANTS[code]
    assert code in inv.example, f"{code}'s example shows no output:\n{inv.example}"
    assert inv.example in inv.explain()
