"""`step_profile`: how compiled ops and aten ops are sorted into kinds."""

from experiments.benchmarks import results
from experiments.benchmarks import step_profile

_HLO = """
ENTRY %main {
  %ynn_fusion.3 = f32[64,2816]{1,0} fusion(%a, %b), kind=kCustom, metadata={op_name="jit(update_step)/jvp(jit(_jit_token_logprobs))/Decoder.hidden_states/layers_0/mlp/dot_general"}
  %ynn_fusion.4 = f32[8,4,512,256]{3,2,1,0} fusion(%c, %d), kind=kCustom, metadata={op_name="jit(update_step)/jvp(x)/Decoder.hidden_states/layers_0/attention/bjqd,bjsd->bjqs/dot_general"}
  %copy_bitcast_fusion.1 = f32[2816,2048]{1,0} fusion(%e), kind=kLoop, metadata={op_name="jit(update_step)/transpose(jvp(x))/layers_0/mlp/jit(silu)"}
  %add_select_fusion.2 = f32[512]{0} fusion(%f), kind=kLoop, metadata={op_name="jit(update_step)/jit(_where)/select_n"}
  %exp_fusion = f32[8,4,512,256]{3,2,1,0} fusion(%g), kind=kLoop, metadata={op_name="jit(update_step)/jvp(x)/layers_1/attention/exp"}
  %wrapped_reduce = f32[8,256]{1,0} fusion(%h), kind=kLoop, metadata={op_name="jit(update_step)/jvp(x)/layers_1/input_norm/reduce_sum"}
  %dot.7 = f32[8,8]{1,0} dot(%i, %j), metadata={op_name="jit(_jit_sample)/while/body/layers_0/attention/dot_general"}
}
"""


def test_our_ops_sorted_by_kind():
  ops = step_profile.hlo_ops(_HLO)
  assert ops["dot.7"][0] == "dot"
  kinds = {name: step_profile.our_kind(name, *ops[name]) for name in ops}
  assert kinds == {
      "ynn_fusion.3": "dense matmuls",     # an MLP matmul
      "ynn_fusion.4": "attention",         # the scores matmul
      "copy_bitcast_fusion.1": "copies",   # a transposing fusion
      "add_select_fusion.2": "optimizer",  # the non-finite guard
      "exp_fusion": "attention",           # the softmax
      "wrapped_reduce": "other",           # a norm
      "dot.7": "dense matmuls",            # a projection while decoding
  }


def test_torch_ops_sorted_by_kind():
  expected = {"aten::mm": "dense matmuls", "aten::addmm": "dense matmuls",
              "aten::bmm": "attention", "aten::_softmax": "attention",
              "aten::_scaled_dot_product_flash_attention_for_cpu":
                  "attention",
              "aten::copy_": "copies", "aten::_fused_adamw_": "optimizer",
              "aten::mul": "other", "aten::silu": "other"}
  assert {op: step_profile.torch_kind(op) for op in expected} == expected


def test_table_rows_sum_to_the_step():
  kinds = dict.fromkeys(results.PROFILE_KINDS, 1.0)
  row = {"model": "tiny", "step": "decode", "batch": 2, "length": 3,
         "ours_ms": 5.0, "torch_ms": 5.0, "ours_kinds_ms": kinds,
         "torch_kinds_ms": step_profile._scaled({"other": 2.0}, 5.0)}
  text = results.step_profile_table({"rows": [row]})
  lines = text.split("\n")
  assert len(lines) == 4 and "per decoding step" in lines[2]
  assert lines[3].endswith("| 0.0 | 0.0 | 0.0 | 0.0 | 5.0 |")
