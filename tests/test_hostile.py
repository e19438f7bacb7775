"""Hostile models, built as an attacker would: saved, then their protobuf edited. Each test checks the side
effect (a file written or copied) did not happen, not only the exit code."""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from test_deploy import refused, tfperf
from tfperf.deploy.inspection import inspect_saved_model

tf1 = tf.compat.v1


def tf1_saved_model(folder, main_op_writes=None):
    """A TF1 SavedModel (y = x @ w) written by tf.compat.v1's Builder, with its own saver; optionally a main
    op that writes a file (TensorFlow runs the main op while loading)."""
    graph = tf.Graph()
    with graph.as_default(), tf1.Session(graph=graph) as session:
        x = tf1.placeholder(tf.float32, [None, 3], name="x")
        w = tf1.get_variable("w", [3, 2], initializer=tf1.ones_initializer())
        y = tf.matmul(x, w, name="y")
        session.run(tf1.global_variables_initializer())
        main_op = tf.io.write_file(str(main_op_writes), "pwned") if main_op_writes else None
        builder = tf1.saved_model.Builder(str(folder))
        builder.add_meta_graph_and_variables(
            session, ["serve"], main_op=main_op,
            signature_def_map={"serving_default": tf1.saved_model.predict_signature_def({"x": x}, {"y": y})})
        builder.save()
    return folder


def edit(folder, change):
    """Apply `change(meta_graph)` to a SavedModel's protobuf, after saving, as an attacker would."""
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((folder / "saved_model.pb").read_bytes())
    change(proto.meta_graphs[0])
    (folder / "saved_model.pb").write_bytes(proto.SerializeToString())
    return folder


def const(graph_or_fn, name, value):
    """A string Const node added to a GraphDef (or a FunctionDef's body)."""
    nodes = graph_or_fn.node if hasattr(graph_or_fn, "node") else graph_or_fn.node_def
    node = nodes.add(name=name, op="Const")
    node.attr["dtype"].type = tf.string.as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
    return node


def restore_writes(target):
    """The saver's restore op becomes a WriteFile of `target`; the rest of the saver is stripped, so that the
    model keeps only what the loader needs (its file name tensor)."""

    def change(meta):
        graph, saver = meta.graph_def, meta.saver_def
        nodes = {n.name: n for n in graph.node}
        keep, stack = set(), [saver.filename_tensor_name.split(":")[0]]
        while stack:
            name = stack.pop()
            if name not in keep:
                keep.add(name)
                stack += [i.lstrip("^").split(":")[0] for i in nodes[name].input]
        kept = [n for n in graph.node if not n.name.startswith("save/") or n.name in keep]
        del graph.node[:]
        graph.node.extend(kept)
        const(graph, "evil/path", str(target))
        const(graph, "evil/contents", "pwned")
        graph.node.add(name=saver.restore_op_name, op="WriteFile", input=["evil/path", "evil/contents"])

    return change


@pytest.fixture
def x_npy(tmp_path):
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    return tmp_path / "x.npy"


def test_a_tf1_saved_model_with_its_own_saver_passes_and_predicts(tmp_path, x_npy):
    model = tf1_saved_model(tmp_path / "tf1")
    report = inspect_saved_model(model)
    assert report.safe, report.flagged  # its save/* nodes are the saver's, judged as such
    code, out, _ = tfperf("predict", model, "--input", x_npy)
    assert code == 0 and "y: float32[2, 2], values 3 to 3" in out


def test_a_restore_op_that_writes_a_file_is_unsafe_and_never_runs(tmp_path, x_npy):
    target = tmp_path / "pwned.txt"
    model = edit(tf1_saved_model(tmp_path / "tf1"), restore_writes(target))
    code, out, _ = tfperf("inspect", model)
    assert code == 1 and "WriteFile: touches the file system (run while the model loads, by its saver's restore op)" \
        in out, out
    assert "WriteFile" in refused("predict", model, "--input", x_npy)
    assert "WriteFile" in refused("export", model, "--root", tmp_path / "exports")
    assert not target.exists() and not (tmp_path / "exports").exists()


def test_a_main_op_that_writes_a_file_is_unsafe(tmp_path, x_npy):
    target = tmp_path / "pwned.txt"
    model = tf1_saved_model(tmp_path / "tf1", main_op_writes=target)
    assert not target.exists()  # building it wrote nothing: the main op runs when the model loads
    assert "WriteFile" in inspect_saved_model(model).flagged
    assert "WriteFile" in refused("predict", model, "--input", x_npy)
    assert not target.exists()


@pytest.fixture(scope="module")
def tf2_model(tmp_path_factory):
    """A TF2 SavedModel with a variable and an asset (vocab.txt) its signature reads the path of."""
    folder = tmp_path_factory.mktemp("tf2")
    (folder / "vocab.txt").write_text("a\nb\n")
    m = tf.Module()
    m.v = tf.Variable([1.0, 2.0, 3.0])
    m.asset = tf.saved_model.Asset(str(folder / "vocab.txt"))
    m.serve = tf.function(lambda x: {"y": x * m.v + 0.0 * tf.cast(tf.strings.length(m.asset.asset_path), tf.float32)},
                          input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    tf.saved_model.save(m, str(folder / "model"), signatures={"serving_default": m.serve})
    return folder / "model"


def copy(model, tmp_path, name="model"):
    import shutil

    return shutil.copytree(model, tmp_path / name)


def test_a_tf2_restore_that_reads_another_checkpoint_is_named(tf2_model, tmp_path):
    def change(meta):
        body = next(f for f in meta.graph_def.library.function if "traced_restore" in f.signature.name)
        const(body, "elsewhere", str(tmp_path / "other" / "ckpt"))
        restore = next(n for n in body.node_def if n.op == "RestoreV2")
        restore.input[0] = "elsewhere:output:0"

    assert inspect_saved_model(tf2_model).safe
    report = inspect_saved_model(edit(copy(tf2_model, tmp_path), change))
    assert any(k.startswith("RestoreV2") and "reads a checkpoint named inside the model" in why
               for k, why in report.flagged.items()), report.flagged


def test_a_tf2_restore_op_that_writes_a_file_is_unsafe(tf2_model, tmp_path, x_npy):
    target = tmp_path / "pwned.txt"

    def change(meta):
        graph = meta.graph_def
        restore = next(n for n in graph.node if n.name == meta.saver_def.restore_op_name)
        graph.node.remove(restore)
        const(graph, "evil/path", str(target))
        const(graph, "evil/contents", "pwned")
        graph.node.add(name=meta.saver_def.restore_op_name, op="WriteFile", input=["evil/path", "evil/contents"])

    model = edit(copy(tf2_model, tmp_path), change)
    assert "restore op" in inspect_saved_model(model).flagged["WriteFile"]
    assert "WriteFile" in refused("predict", model, "--input", x_npy)
    assert not target.exists()


@pytest.mark.parametrize("how", ["absolute path", "dot-dot", "link"])
def test_an_asset_outside_the_model_is_unsafe_and_never_copied_even_when_trusted(tf2_model, tmp_path, how):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    model = copy(tf2_model, tmp_path / "deep" / "er")
    if how == "link":
        (model / "assets" / "vocab.txt").unlink()
        (model / "assets" / "vocab.txt").symlink_to(secret)
    else:
        name = str(secret) if how == "absolute path" else "../../../../secret.txt"  # assets/ -> model -> er -> deep -> tmp_path
        edit(model, lambda meta: setattr(meta.asset_file_def[0], "filename", name))
    code, out, _ = tfperf("inspect", model)
    assert code == 1 and f"names {secret}, outside the model's folder" in out, out
    line = refused("export", model, "--root", tmp_path / "exports", "--trust")
    assert "outside its folder" in line and "even with --trust" in line
    assert not (tmp_path / "exports").exists()
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink() and p.read_bytes() == b"TOP SECRET" and p != secret]
