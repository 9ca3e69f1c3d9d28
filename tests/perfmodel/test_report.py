"""perfmodel.report's remarks on a plan: the accuracy remark every quantized plan carries."""

from __future__ import annotations

import pytest

from perfmodel.report import quantization_remark


@pytest.mark.parametrize("formats, native, lower", [
    ({"bf16", "a16", "bf16"}, "bf16", None),                  # the model's own formats: no remark
    ({"fp8", "a8", "fp8"}, "fp8", None),                      # an fp8 model computes in 8 bits as published
    ({"fp8", "a8", "fp8"}, "bf16", "a8, fp8"),                # below a bf16 model's own: both named
    ({"int4", "a16", "fp8"}, "fp8", "int4"),                  # 4-bit weights below an fp8 model
    ({"fp4", "a4", "int4"}, "fp4", "a4, int4"),               # a native-fp4 model still names its 4-bit activations
])
def test_the_remark_names_exactly_the_formats_below_the_models_own(formats, native, lower):
    remark = quantization_remark(formats, native)
    if lower is None:
        assert remark is None
    else:
        assert remark.startswith(f"quantized: {lower} (the model is published in {native})")
