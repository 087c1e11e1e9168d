"""pomt.runtimes.exported: the session pomt times its ONNX programs in."""

from __future__ import annotations

import numpy as np

from pomt.runtimes.exported import onnxruntime_session


def test_onnxruntime_sessions_do_not_spin_between_runs(tmp_path):
    """pomt alternates programs; a session whose threads spin-wait after a run would slow the next one."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / "relu.onnx"
    # an opset and IR version every onnxruntime pomt supports reads, whatever onnx writes by default
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    session = onnxruntime_session(path, "cpu", threads=2)
    options = session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.intra_op_num_threads == 2
    assert session.run(None, {"x": np.array([-1.0, 2.0], dtype=np.float32)})[0].tolist() == [0.0, 2.0]
