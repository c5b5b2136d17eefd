"""Lowering up to the backend's validate(), without a GPU.

Needs the cuDNN frontend AND libcudnn (the frontend's validate() calls into it; seen
2026-11-29: without libcudnn even the builder's constructor fails, "Unable to find symbol
cudnnCreate"). Where libcudnn cannot load the lowering rows skip with that reason; the
rows marked `anywhere` run on any machine."""

import pytest
from backend_graphs import CASES, conv_fprop, matmul

import cudnn_pygraph as cudnn
from cudnn_pygraph import heur_mode, knob_type
from cudnn_pygraph.backend import adapter, backend_plans, lowering
from cudnn_pygraph.planning import manifest
from cudnn_pygraph.planning.device import detect_device

REASON = lowering.unavailable_reason()
needs_backend = pytest.mark.skipif(
    REASON is not None, reason=f"the backend cannot lower here: {REASON}"
)
HAS_GPU = (detect_device() is not None) and not detect_device().is_interpreter


def _touched(graph):
    """uids of every tensor a node reads or writes, with their ragged offsets."""
    tensors = {t for n in graph.nodes for t in (*n.input_tensors(), *n.output_tensors())}
    tensors |= {t.ragged_offset for t in tensors if t.ragged_offset is not None}
    return {t.uid: t for t in tensors}


# ---------------------------------------------------------------- every case lowers
@needs_backend
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_case_lowers_with_our_uids_and_our_shapes(case):
    g, _ = CASES[case](deviceless=True)
    g.validate()
    # validate() lowers (and freezes) a graph the backend can lower, unless the graph's
    # family validated it natively (gemm with its engine offered; the SDPA families, as
    # the classic does): that one stays open until planning, which lowers it then.
    family = manifest.family_for(g)
    natively = family is not None and family.name in ("gemm", "sdpa_fwd", "sdpa_bwd")
    assert (g._lowered is None) == bool(natively) and g._state.mutable == bool(natively)
    lg = lowering.lowered(g)
    ours = _touched(g)
    assert set(lg.tensors) == set(ours)
    for uid, theirs in lg.tensors.items():
        t = ours[uid]
        assert theirs.get_uid() == uid
        if t.value is None:  # a graph-held scalar is named by the backend (classic)
            assert theirs.get_name() == t.name
        assert theirs.get_is_virtual() == t.is_virtual, t.name
    # our shape rules and the backend's inference agree on every output's dims
    for node in g.nodes:
        for t in node.output_tensors():
            assert tuple(lg.tensors[t.uid].get_dim()) == tuple(t.dim), f"{node.name}: {t.name}"


@needs_backend
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_backend_layout_lands_on_fields_the_caller_left(case):
    g, _ = CASES[case](deviceless=True)
    g.validate()
    declared = {
        t.uid: {f: t.is_user_set(f) and getattr(t, f) for f in ("dim", "stride", "data_type")}
        for n in g.nodes
        for t in n.output_tensors()
    }
    assert adapter.finalize_layout(g) is None
    lg = g._lowered
    for n in g.nodes:
        for t in n.output_tensors():
            theirs = lg.tensors[t.uid]
            assert tuple(t.stride) == tuple(theirs.get_stride()), t.name
            theirs_dtype = theirs.get_data_type().value  # NOT_SET: decided at build (io type)
            assert theirs_dtype in (0, int(t.data_type)), t.name
            for field, value in declared[t.uid].items():
                if value is not False:
                    assert getattr(t, field) == value, (
                        f"{t.name}: the caller's {field} was replaced"
                    )


@needs_backend
@pytest.mark.parametrize("user_stride", [False, True], ids=["inferred-stride", "user-stride"])
def test_conv_output_layout_contract(user_stride):
    """Only a USER stride is pushed: left alone, the backend's channels-last layout lands
    on the IR (our rule's row-major was provisional); set, the caller's survives."""
    g, t = conv_fprop(deviceless=True, user_stride=user_stride)
    g.validate()
    adapter.finalize_layout(g)
    k, h, w = 64, 16, 16
    expect = (k * h * w, h * w, w, 1) if user_stride else (k * h * w, 1, w * k, k)
    assert t["Y"].stride == expect
    assert tuple(g._lowered.tensors[t["Y"].uid].get_stride()) == expect


@needs_backend
def test_conv_other_overload_lowers():
    """pre/post padding is the builder's second overload: lowering hands only the
    keywords the caller set, so pybind picks the right one."""
    g, t = conv_fprop(deviceless=True, pre_post=True)
    lg = lowering.lowered(g)
    assert tuple(lg.tensors[t["Y"].uid].get_dim()) == (4, 64, 16, 16)


# ---------------------------------------------------------------- uid ownership
@needs_backend
def test_user_uid_stealing_an_auto_uid_survives_lowering():
    g, t = matmul(deviceless=True)
    taken = t["B"].uid
    t["A"].set_uid(taken)  # A takes B's auto uid; B is renumbered
    t["C"].set_uid(1000)
    assert t["B"].uid != taken
    lg = lowering.lowered(g)
    assert lg.tensors[taken].get_name() == "A"
    assert lg.tensors[t["B"].uid].get_name() == "B"
    assert lg.tensors[1000].get_name() == "C"
    assert all(theirs.get_uid() == uid for uid, theirs in lg.tensors.items())


@needs_backend
def test_uid_not_pushed_fails_loudly(monkeypatch):
    """The post-build assertion: a backend tensor whose uid is not ours (what C++
    auto-assignment would give) stops lowering."""
    pushing = lowering._Builder.output

    def auto_assigned(self, node, port, ours, theirs):
        pushing(self, node, port, ours, theirs)
        theirs.set_uid(ours.uid + 500)

    monkeypatch.setattr(lowering._Builder, "output", auto_assigned)
    g, _ = matmul(deviceless=True)
    with pytest.raises(RuntimeError, match="uids other than the IR's"):
        lowering.lowered(g)


# ---------------------------------------------------------------- refusals
def test_python_only_graph_refused_at_lowering():  # anywhere: refused before the frontend
    from test_graph_ir import gdn_graph

    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="gdn node .* python-only op"):
        lowering.lowered(gdn_graph())


@needs_backend
def test_backend_refusal_names_the_node():
    """The backend's own message, the classic type, the node named even when the
    message does not say it (found by validating growing prefixes)."""
    g2 = cudnn.pygraph(
        name="alibi",
        io_data_type=cudnn.data_type.BFLOAT16,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        sm_version=90,
        sm_count=132,
    )
    q, k, v = (g2.tensor([1, 2, 64, 64], name=n) for n in "qkv")
    x = g2.scale(q, g2.tensor([1, 1, 1, 1], name="s"), name="prescale")
    o, _ = g2.sdpa(x, k, v, attn_scale=0.125, use_alibi_mask=True, name="attn_alibi")
    g2.relu(o, name="after").set_output(True)
    with pytest.raises(cudnn.cudnnGraphNotSupportedError) as err:
        lowering.lowered(g2)
    assert "sdpa node 'attn_alibi'" in str(err.value)
    assert "alibi" in str(err.value)  # the backend's own words


@needs_backend
def test_score_mod_lowers_as_a_backend_hook():
    """A modifier recorded at describe time reaches the backend as its score_mod hook
    (tests/sdpa/test_score_mod.py compares the sub-graph it builds with NVIDIA's)."""
    g = cudnn.pygraph(
        io_data_type=cudnn.data_type.BFLOAT16,
        sm_version=90,
        sm_count=132,
        intermediate_data_type=cudnn.data_type.FLOAT,
    )
    q, k, v = (g.tensor([1, 2, 64, 64], name=n) for n in "qkv")
    o, _ = g.sdpa(
        q,
        k,
        v,
        attn_scale=0.125,
        generate_stats=False,
        score_mod=lambda graph, s: graph.tanh(s),
        name="attn",
    )
    o.set_output(True)
    lowering.lowered(g)  # validated by the backend
    hook = lowering._Builder(lowering.frontend(), None, None).value(g.nodes[0].attrs["score_mod"])
    assert callable(hook)


def test_a_bare_callable_attribute_is_refused_at_lowering():
    builder = lowering._Builder(None, None, None)
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="callable attribute"):
        builder.value(lambda graph, s: s)


# ---------------------------------------------------------------- key, plans, replay
@needs_backend
def test_key_follows_the_graph():
    a, b = matmul(deviceless=True)[0], matmul(deviceless=True)[0]
    other = matmul(M=64, deviceless=True)[0]
    assert a.key() == b.key()
    assert a.key() != other.key()


@needs_backend
@pytest.mark.skipif(HAS_GPU, reason="the no-GPU outcome; the GPU suite covers plans")
def test_plan_entries_without_a_gpu_name_the_reason_per_mode():
    g, _ = matmul(deviceless=True)
    entries, outcome = backend_plans.plan_entries(g, [heur_mode.A, heur_mode.FALLBACK])
    assert entries == []
    assert set(outcome) == {heur_mode.A, heur_mode.FALLBACK}
    # Which backend call gives up without a GPU depends on the libcudnn release; what is
    # ours is that every mode names a reason.
    assert all(isinstance(r, str) and r for r in outcome.values())


@needs_backend
def test_replay_refuses_a_frontend_band_knob():
    g, _ = matmul(deviceless=True)
    with pytest.raises(ValueError, match="SPLIT_KV is a frontend-band knob"):
        backend_plans.replay_entry(g, 7, {knob_type.SPLIT_KV: 2})


def test_backend_unavailable_keeps_the_graph_api(monkeypatch):  # anywhere
    """Frontend present, libcudnn absent (CI): validate stays native, the backend
    offers nothing and says why, planning names the reason."""
    reason = "libcudnn cannot be loaded here (test)"
    monkeypatch.setattr(adapter, "backend_installed", lambda: True)  # also where it is not
    monkeypatch.setattr(lowering, "_load_frontend", lambda: (None, reason))
    g, _ = matmul()
    g.validate()
    assert g._lowered is None
    assert reason in adapter.finalize_layout(g)
    entries, outcome = adapter.BACKEND.plan_entries(g, [heur_mode.A])
    assert entries == [] and reason in outcome[heur_mode.A]
    with manifest.use_families([]):
        with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="libcudnn cannot be loaded"):
            matmul()[0].create_execution_plans([heur_mode.A])


@needs_backend
def test_nvidias_package_keeps_working_after_ours_loaded_the_frontend():
    """A process that lowered through us first and then says `import cudnn` (FlashInfer
    does) gets NVIDIA's package whole: the compiled module bound on it, one copy."""
    import subprocess
    import sys

    program = (
        "import cudnn_pygraph\n"
        "from cudnn_pygraph.backend import lowering\n"
        "lowering.frontend()\n"
        "import cudnn\n"
        "assert cudnn._compiled_module is lowering.frontend().module\n"
        "g = cudnn.pygraph()\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")


@needs_backend
@pytest.mark.parametrize("producer", ["relu", "conv"])
def test_a_slice_of_a_node_output_lowers_without_crashing_the_backend(producer):
    """The backend's slice reads its input's dims when called: a node output it has not
    dimensioned crashed the process (both packages). Ours pushes the IR's dims first: the
    graph validates or is refused with a classic error, in a process that survives."""
    import subprocess
    import sys

    make = {
        "relu": "y = g.relu(input=x)",
        "conv": "y = g.conv_fprop(image=x, weight=g.tensor([8, 8, 3, 3], name='w'), "
        "padding=[1, 1], stride=[1, 1], dilation=[1, 1])",
    }[producer]
    program = (
        "import cudnn_pygraph as c\n"
        "dt = c.data_type\n"
        "g = c.pygraph(io_data_type=dt.HALF, intermediate_data_type=dt.FLOAT,"
        " compute_data_type=dt.FLOAT)\n"
        "x = g.tensor([1, 8, 16, 16], name='x')\n"
        f"{make}\n"
        "s = g.slice(y, [slice(0, 1), slice(0, 4), slice(0, 16), slice(0, 16)])\n"
        "s.set_output(True)\n"
        "try:\n"
        "    g.validate()\n"
        "    print('validated')\n"
        "except c.cudnnGraphNotSupportedError as exc:\n"
        "    print('refused:', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(("validated", "refused: slice node"))


def test_a_node_reading_a_virtual_adalayernorm_dbias_is_refused_without_a_crash():
    """tools/fuzz.py --seed 2: the backend dimensions adalayernorm_backward's DBIAS only
    when it is a graph output, and instancenorm_backward reading the virtual DBIAS crashed
    the process in validate(). Ours pushes the IR's dims first: a classic refusal, in a
    process that survives."""
    import subprocess
    import sys

    program = (
        "import cudnn_pygraph as c\n"
        "dt = c.data_type\n"
        "g = c.pygraph(io_data_type=dt.FLOAT, intermediate_data_type=dt.FLOAT,"
        " compute_data_type=dt.FLOAT)\n"
        "x = g.tensor([3, 6, 6, 5], name='x', data_type=dt.HALF)\n"
        "dx, ds, db = g.adalayernorm_backward(grad=x, input=x, scale=x, mean=x,"
        " inv_variance=x)\n"
        "g.instancenorm_backward(grad=x, input=db, scale=x, mean=x, inv_variance=x)\n"
        "try:\n"
        "    g.validate()\n"
        "    print('validated')\n"
        "except c.cudnnGraphNotSupportedError as exc:\n"
        "    print('refused:', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(("validated", "refused: adalayernorm_backward node"))


@pytest.mark.parametrize("n_slices", [0, 1])
def test_a_slice_short_of_the_input_rank_is_refused_before_a_reader_crashes(n_slices):
    """tools/fuzz.py --seed 2: the backend gives a slice's output one dim per slice (none
    for an empty list) and one stride per input axis; adalayernorm reading that output
    crashed the process in validate(). The classic refuses such an output; ours refuses the
    slice at validate, naming the attribute, in a process that survives."""
    import subprocess
    import sys

    program = (
        "import cudnn_pygraph as c\n"
        "dt = c.data_type\n"
        "g = c.pygraph(io_data_type=dt.HALF, intermediate_data_type=dt.FLOAT,"
        " compute_data_type=dt.FLOAT)\n"
        "x = g.tensor([4, 6], name='x', data_type=dt.FLOAT)\n"
        f"s = g.slice(input=x, slices=[slice(0, 2)] * {n_slices})\n"
        "g.adalayernorm(input=s, scale=s, epsilon=x,"
        " norm_forward_phase=c.norm_forward_phase.TRAINING)\n"
        "try:\n"
        "    g.validate()\n"
        "    print('validated')\n"
        "except c.cudnnGraphNotSupportedError as exc:\n"
        "    print('refused:', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("refused: slice node") and "slices" in out.stdout


def test_sdpa_mxfp8_backward_returns_and_lowers_the_six_outputs_of_the_classic():
    """tools/fuzz.py --seed 2: the backend's sdpa_mxfp8_backward returns dQ, dK, dV and
    their three amax scalars; the OpSpec declared three, and lowering raised a bare
    RuntimeError. A classic program unpacks six."""
    dt = cudnn.data_type
    g = cudnn.pygraph(
        io_data_type=dt.BFLOAT16, intermediate_data_type=dt.FLOAT, compute_data_type=dt.FLOAT
    )
    dims = [1, 2, 128, 128]

    def t(d=dt.FP8_E4M3, shape=dims):
        return g.tensor(shape, data_type=d)

    def scale():
        return t(dt.FP8_E8M0, dims[:3] + [4])

    outs = g.sdpa_mxfp8_backward(
        q=t(), q_T=t(), k=t(), k_T=t(), v=t(), o_f16=t(dt.BFLOAT16), dO_f16=t(dt.BFLOAT16),
        dO=t(), dO_T=t(), stats=t(dt.FLOAT, dims[:3] + [1]), descale_q=scale(),
        descale_q_T=scale(), descale_k=scale(), descale_k_T=scale(), descale_v=scale(),
        descale_dO=scale(), descale_dO_T=scale(), attn_scale=0.125,
    )  # fmt: skip
    assert [o.name.split("::")[1] for o in outs] == [
        "dQ", "dK", "dV", "Amax_dQ", "Amax_dK", "Amax_dV"
    ]  # fmt: skip
    for o in outs[:3]:
        o.set_output(True)
    g.validate()
