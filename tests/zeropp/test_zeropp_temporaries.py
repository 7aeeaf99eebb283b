"""The temporaries of ZeRO++'s quantized collectives (qwZ's gathers, qgZ's exchanges) at W=4 in nodes of
2: measured live bytes equal `nano.zeropp.quantization`'s figures, which `zero-lab explain`'s peak adds."""

import pytest

from tests.spawn import run_distributed
from tests.zeropp import temporaries_workers

pytestmark = pytest.mark.slow  # spawns gloo ranks


def test_a_quantized_gather_and_a_quantized_exchange_hold_the_predicted_temporaries():
    assert run_distributed(temporaries_workers.temporaries_worker, 4) == []
