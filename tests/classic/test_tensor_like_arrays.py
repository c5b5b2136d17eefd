"""pygraph.tensor_like of arrays other than torch tensors (sample 01 declares a graph from
CuPy arrays), against NVIDIA's tensor_like for the same array: dims, element strides, data
type and pass-by-value."""

import subprocess
import sys

import pytest

import cudnn_pygraph as ours

np = pytest.importorskip("numpy")


class DLPackOnly:
    """A DLPack producer with no stride() and no array interface (e.g. a JAX array)."""

    def __init__(self, array):
        self._array, self.shape, self.dtype = array, array.shape, array.dtype

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


class DeviceArray:
    """A dense __cuda_array_interface__ producer (CuPy's contract; strides None = dense)."""

    def __init__(self, shape, typestr="<f2"):
        self.shape = shape
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (0, False),
            "version": 3,
            "strides": None,
        }


_base = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
ARRAYS = {
    "c-order": _base,
    "f-order half": np.asfortranarray(_base.astype(np.float16)),
    "transposed": _base.transpose(2, 0, 1),
    "sliced": _base[:, ::2],
    "bool": np.zeros((2, 3), dtype=bool),
    "int64 1-d": np.zeros(3, dtype=np.int64),
    "0-d": np.zeros((), dtype=np.float32),
    "scalar": np.float32(1.5),
    "zero-size": np.zeros((0, 3), dtype=np.float32),
    "device interface": DeviceArray((5, 7)),
}


def describe(lib, array):
    t = lib.pygraph().tensor_like(array)
    dtype = t.get_data_type()
    unset = dtype is None or dtype == ours.data_type.NOT_SET  # NVIDIA's getter says None
    return (
        list(t.get_dim()),
        list(t.get_stride()),
        "unset" if unset else str(dtype),
        (t.get_is_pass_by_value()),
    )


@pytest.fixture(scope="module")
def nv():
    return pytest.importorskip("cudnn")


@pytest.mark.parametrize("key", list(ARRAYS))
def test_an_array_is_declared_as_nvidias_tensor_like_declares_it(nv, key):
    got, theirs = describe(ours, ARRAYS[key]), describe(nv, ARRAYS[key])
    if 0 in got[0]:
        # an empty array's strides address nothing, and numpy releases report them
        # differently (2.5 says 0s): dims, dtype and by-value are what a declaration keeps
        got, theirs = got[:1] + got[2:], theirs[:1] + theirs[2:]
    assert got == theirs
    assert got[-2] == "unset" and got[-1] is False  # a host numpy array is not by value


def test_a_dlpack_producer_is_read_through_dlpack(nv):
    pytest.importorskip("torch")
    array = DLPackOnly(_base.transpose(1, 0, 2))
    assert describe(ours, array) == describe(nv, array)
    assert describe(ours, array)[:2] == ([3, 2, 4], [4, 12, 1])


def test_strides_an_array_interface_gives_are_honoured():
    """Where the interface gives byte strides they are converted to element strides (a
    column-major device array is not taken as dense row-major)."""
    array = DeviceArray((2, 3))
    array.__cuda_array_interface__["strides"] = (2, 4)  # float16, column-major
    assert describe(ours, array)[:2] == ([2, 3], [1, 2])


@pytest.mark.parametrize("value", [[1, 2], 3.0, object()])
def test_a_value_without_dims_is_refused(value):
    with pytest.raises(TypeError, match="tensor_like"):
        ours.pygraph().tensor_like(value)


def test_a_numpy_array_is_read_without_importing_torch():
    code = (
        "import sys, numpy, cudnn_pygraph as c; "
        "t = c.pygraph().tensor_like(numpy.zeros((4, 2), numpy.float16).T); "
        "assert (tuple(t.get_dim()), tuple(t.get_stride())) == ((2, 4), (1, 2)), t; "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
