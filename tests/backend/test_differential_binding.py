"""The classic differential (classic_gpu_diff.py) binds each graph's inputs by the
generator's names: a name the generator gives both an input and a later op result (a
matmul's bias tensor and the bias op) must still bind the input, or both packages refuse
the pack ("missing a buffer for ... 'bias1'") and the row reports the harness, not a
package."""

import classic_gpu_diff as gd
import classic_graphs as cg

import cudnn_pygraph as ours


def _produced(graph):
    return {t.uid for node in graph.nodes for t in node.output_tensors()}


def test_every_input_name_binds_a_graph_input():
    shadowed = 0
    for seed in range(400):
        desc = cg.generate(seed)
        if "!" in desc.family:  # hostile graphs may not build
            continue
        bound = gd.unshadowed(desc)
        shadowed += bound != desc
        g, env = cg.build(ours, bound)
        produced = _produced(g)
        for name in bound.inputs:
            assert env[name].uid not in produced, (desc.name, name)
    assert shadowed  # the generator does reuse names: the case is exercised


def test_the_bias_input_and_the_bias_result_get_their_own_keys():
    desc = cg.generate(101)  # matmul: tensor 'bias1' then bias(..., name='bias1')
    assert "bias1" in desc.inputs and "bias1" in desc.outputs
    g, env = cg.build(ours, gd.unshadowed(desc))
    bias_node = next(n for n in g.nodes if n.op == "bias")
    assert env["bias1"] is bias_node.inputs["bias"]
    assert env["bias1~"] in bias_node.output_tensors()


def test_callback_scalars_are_the_score_mods_scale_values():
    desc = cg.generate(105)  # sdpa score_mod ['identity', ('scale', 0.5)]
    assert gd.callback_scalars(desc) == [0.5]
