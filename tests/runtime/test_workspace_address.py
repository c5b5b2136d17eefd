"""workspace_address: a backend plan's workspace read in one crossing, by the same
readers as an operand, refused when it is too small or unreadable."""

import numpy as np
import pytest
import torch

from cudnn_pygraph import data_type
from cudnn_pygraph.runtime.variant_pack import DeclaredLayout, VariantPack, workspace_address

pytestmark = pytest.mark.both_variant_packs  # native and pure-Python (conftest)

NEED = 256


def _operand_buffer(nbytes):
    t = torch.empty(nbytes, dtype=torch.uint8)
    lay = DeclaredLayout([(1, (nbytes,), (1,), int(data_type.UINT8), 8)])
    return VariantPack.from_objects(lay, [t]).operands([0])[0], t.data_ptr()


def _tensor(dtype, n):
    t = torch.empty(n, dtype=dtype)
    return t, t.data_ptr()


def _array(n):
    a = np.empty(n, np.uint8)
    return a, a.ctypes.data


READABLE = {
    "int": lambda: (0xABC000, 0xABC000),
    "torch": lambda: _tensor(torch.uint8, NEED),
    "torch-fp32-covers": lambda: _tensor(torch.float32, NEED // 4),
    "numpy": lambda: _array(NEED),
    "operand-buffer": lambda: _operand_buffer(NEED),
}


@pytest.mark.parametrize("kind", list(READABLE), ids=list(READABLE))
def test_reads_the_address(kind):
    obj, ptr = READABLE[kind]()
    assert workspace_address(obj, NEED) == ptr


@pytest.mark.parametrize(
    "obj, error, message",
    [
        (
            torch.empty(NEED - 1, dtype=torch.uint8),
            ValueError,
            f"spans {NEED - 1} bytes and this plan needs {NEED}",
        ),
        (0, ValueError, "address 0 is NULL"),
        (-5, ValueError, "positive 64-bit"),
        ("ws", TypeError, "cannot read a device address from a str"),
        (True, TypeError, "bool"),
    ],
    ids=["too-small", "null", "negative", "str", "bool"],
)
def test_refuses_with_the_rule(obj, error, message):
    with pytest.raises(error, match=message):
        workspace_address(obj, NEED)
