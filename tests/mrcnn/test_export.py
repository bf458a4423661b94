"""torch.export and AOTInductor packages of the static model, and the C++ example that runs them.

The custom ops' own checks (``torch.library.opcheck`` of ``mrcnn::nms_fixed``,
``mrcnn::multilevel_roi_align`` and their ``*_tv`` torchvision-kernel forms, fake kernels and
autograd) live in tests/mrcnn/test_ops_*.py. Here: the packages hold none of those ops (all have Python
kernels only), neither as a graph node nor as an op an AOTInductor package calls by name.
``mrcnn export`` (:mod:`mrcnn.export.cli`) builds and checks packages; the harness's
``mrcnn-bench export-time`` (:mod:`mrcnn_bench.running.export_timing`) checks and times them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from mrcnn.export import DeployableMaskRCNN, build_packages, load_exported, read_meta, read_ppm, write_ppm
from mrcnn.export import cli as export_cli
from mrcnn.export.checks import aoti_extern_ops, check_aoti_package, check_exportable
from mrcnn.export.compare import match_outputs
from mrcnn.export.core import OUTPUT_NAMES, decompose_mrcnn_ops, example_inputs, export_model, tensor_ops_model
from mrcnn.model import MaskRCNN
from mrcnn.parity import match_detections
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights, textured_images
from mrcnn_bench.running import export_timing
from tests.helpers.detections import BOX_ATOL_PX, PROB_ATOL

ROOT = Path(__file__).resolve().parents[2]
CANVAS = (320, 448)  # tiny's bucket for a 240x320 image
IMAGE_SIZE = (240, 320)


@pytest.fixture(scope="module")
def model(tiny_cfg, tiny_weights):
    # NCHW in eager, as the exported graph is (under export "auto" keeps NCHW): compared to 1e-4.
    return load_torchvision_weights(MaskRCNN(tiny_cfg.replace(channels_last=False)).eval(), tiny_weights)


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    """A uint8 [3, 240, 320] image, as read back from the PPM the C++ example reads."""
    path = write_ppm(tmp_path_factory.mktemp("image") / "sample.ppm", textured_images((IMAGE_SIZE,), seed=3)[0])
    return read_ppm(path), path


@pytest.fixture(scope="module")
def batch(tiny_cfg, image):
    return to_image_batch([image[0]], tiny_cfg)


@pytest.fixture(scope="module")
def eager_outputs(model, batch):
    """What every package must reproduce: eager forward of the pure-tensor model."""
    with torch.no_grad():
        return DeployableMaskRCNN(tensor_ops_model(model))(batch.tensors, batch.image_sizes)


@pytest.fixture(scope="module")
def exported_path(model, tmp_path_factory):
    info = build_packages(model, tmp_path_factory.mktemp("exported"), CANVAS, 1, formats=("exported",))
    return Path(info["paths"]["exported"])


@pytest.fixture(scope="module")
def aoti_path(model, tmp_path_factory):
    info = build_packages(model, tmp_path_factory.mktemp("aoti"), CANVAS, 1, formats=("aoti",))
    return Path(info["paths"]["aoti"])


def assert_outputs_close(expected, actual):
    """The package's outputs (boxes, scores, labels, masks, valid) against eager's: valid and labels
    equal, the rest to float rounding (tests/helpers/detections.py)."""
    names = OUTPUT_NAMES
    for name, e, a in zip(names, expected, actual):
        assert a.shape == e.shape and a.dtype == e.dtype, (name, a.shape, a.dtype, e.shape, e.dtype)
    assert torch.equal(expected[4], actual[4]), "valid masks differ"
    assert torch.equal(expected[2], actual[2]), "labels differ"
    torch.testing.assert_close(actual[0], expected[0], atol=BOX_ATOL_PX, rtol=0)
    torch.testing.assert_close(actual[1], expected[1], atol=PROB_ATOL, rtol=0)
    torch.testing.assert_close(actual[3], expected[3], atol=PROB_ATOL, rtol=0)


# ------------------------------------------------------------------------------------------------
# Exported program


@pytest.mark.filterwarnings("ignore:The given buffer is not writable")
def test_export_is_static_and_aten_only(exported_path, eager_outputs):
    ep = torch.export.load(exported_path)
    check_exportable(ep)  # raises on symbolic sizes, non-aten ops or ops without a C++ kernel
    assert not ep.range_constraints
    # mrcnn::nms_fixed and mrcnn::multilevel_roi_align were decomposed into aten ops (the reload
    # above would fail on a node naming an op this process had not registered).
    ops = {n.target for n in ep.graph.nodes if isinstance(n.target, torch._ops.OpOverload)}
    assert {op.namespace for op in ops} == {"aten"}
    assert {torch.ops.aten.bmm.default, torch.ops.aten.topk.default} <= ops  # NMS's fixed point, top-k
    assert any("embedding_bag" in op.name() for op in ops)  # RoIAlign's weighted gather
    user_inputs = set(ep.graph_signature.user_inputs)
    shapes = [tuple(n.meta["val"].shape) for n in ep.graph.nodes if n.op == "placeholder" and n.name in user_inputs]
    assert shapes == [(1, 3, *CANVAS), (1, 2)]
    assert eager_outputs[4].sum() > 10, "the sample image should give real detections"


@pytest.mark.slow
def test_strict_export_traces_whole_model(model):
    """strict=True traces with TorchDynamo, which raises on any graph break; same graph as non-strict."""
    ep = export_model(model, CANVAS, 1, strict=True)
    assert not ep.range_constraints
    assert any(n.target == torch.ops.aten.topk.default for n in ep.graph.nodes)


def test_check_exportable_rejects_dynamic_and_custom_ops(model):
    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    dyn = torch.export.export(Double(), (torch.zeros(4, 3),), dynamic_shapes=({0: torch.export.Dim("n")},))
    with pytest.raises(RuntimeError, match="symbolic"):
        check_exportable(dyn)

    # The torchvision-kernel ops export too (their fake kernels give the static shapes), but their
    # Python kernels could not run from C++: check_exportable names them. (The composite ops left
    # undecomposed are rejected the same way: tests/mrcnn/test_ops_composite.py.)
    tv = MaskRCNN(model.cfg.replace(ops_impl="torchvision")).eval()
    tv.load_state_dict(model.state_dict())
    with torch.no_grad():
        ep = torch.export.export(DeployableMaskRCNN(tv), example_inputs(CANVAS, 1))
    assert not ep.range_constraints
    assert decompose_mrcnn_ops(ep) is ep  # nothing composite to decompose: the *_tv ops stay
    with pytest.raises(RuntimeError, match=r"mrcnn::nms_fixed_tv, not an aten op \(its kernels are written in Py"):
        check_exportable(ep)
    with pytest.raises(RuntimeError, match=r"mrcnn::multilevel_roi_align_tv, not an aten op"):
        check_exportable(ep)


def test_exported_reloads_in_fresh_process(exported_path, batch, eager_outputs, tmp_path):
    torch.save({"images": batch.tensors, "image_sizes": batch.image_sizes}, tmp_path / "inputs.pt")
    script = (
        "import sys, torch\n"
        "from mrcnn.export import load_exported\n"
        "m = load_exported(sys.argv[1])\n"
        "x = torch.load(sys.argv[2])\n"
        "torch.save(list(m(x['images'], x['image_sizes'])), sys.argv[3])\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-c", script, str(exported_path), str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_outputs_close(eager_outputs, torch.load(tmp_path / "out.pt"))


def test_exported_predict_matches_eager_model(exported_path, model, image):
    deployed = load_exported(exported_path)
    assert deployed.format == "exported" and deployed.meta.canvas == CANVAS and deployed.meta.ops_impl == "tensor"
    (got,) = deployed.predict([image[0]])
    (want,) = tensor_ops_model(model).predict([image[0]])
    assert torch.equal(got["labels"], want["labels"])
    torch.testing.assert_close(got["boxes"], want["boxes"], atol=BOX_ATOL_PX, rtol=0)
    torch.testing.assert_close(got["masks"], want["masks"], atol=PROB_ATOL, rtol=0)


def test_wrong_inputs_name_what_was_expected(exported_path, batch, tmp_path):
    deployed = load_exported(exported_path)
    images, sizes = batch.tensors, batch.image_sizes
    with pytest.raises(ValueError, match=r"wrong canvas size.*\[1, 3, 320, 448\].*got images of canvas 320x512"):
        deployed(torch.zeros(1, 3, 320, 512), sizes)
    with pytest.raises(ValueError, match=r"wrong dtype.*torch\.float32.*got images of dtype torch\.float64"):
        deployed(images.double(), sizes)
    with pytest.raises(ValueError, match=r"wrong batch size.*batch size 1.*got a batch of 2"):
        deployed(images.expand(2, -1, -1, -1), sizes.expand(2, -1))
    with pytest.raises(ValueError, match=r"image_sizes \[1, 2\] torch\.int64.*torch\.int32"):
        deployed(images, sizes.int())
    with pytest.raises(ValueError, match=r"image_sizes must lie in \[1, 320\] x \[1, 448\]"):
        deployed(images, torch.tensor([[320, 500]]))
    with pytest.raises(ValueError, match=r"shape \[3, 320, 448\]"):
        deployed(images[0], sizes)
    # 240x400 resizes to 307x512: wider than the canvas.
    with pytest.raises(ValueError, match=r"resizes to 307x512, which does not fit this package's canvas 320x448"):
        deployed.predict([torch.rand(3, 240, 400)])
    with pytest.raises(ValueError, match="2 images for a package of batch size 1"):
        deployed.image_batch([torch.rand(3, 240, 320)] * 2)
    (tmp_path / "bogus.pt2").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"not a \.pt2 package"):
        load_exported(tmp_path / "bogus.pt2")
    with pytest.raises(ValueError, match="not found"):
        load_exported(tmp_path / "missing.pt2")


def test_ppm_roundtrip_with_comment(tmp_path):
    img = torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8)
    path = write_ppm(tmp_path / "a.ppm", img)
    assert torch.equal(read_ppm(path), img)
    data = path.read_bytes()
    (tmp_path / "b.ppm").write_bytes(data.replace(b"P6\n", b"P6\n# made by a test\n", 1))
    assert torch.equal(read_ppm(tmp_path / "b.ppm"), img)
    (tmp_path / "c.ppm").write_bytes(data[:-5])
    with pytest.raises(ValueError, match="truncated"):
        read_ppm(tmp_path / "c.ppm")


@pytest.fixture(scope="module")
def cli_export(tiny_weights, tmp_path_factory):
    """``mrcnn export --check`` of the exported format: (its output folder, the weights file, return code)."""
    root = tmp_path_factory.mktemp("cli")
    torch.save(tiny_weights, root / "w.pt")
    parser = argparse.ArgumentParser()
    export_cli.add_arguments(parser)
    args = parser.parse_args(["--weights", str(root / "w.pt"), "--format", "exported", "--out", str(root / "out"),
                              "--sample-image", "240x320", "--check"])
    return root / "out", root / "w.pt", export_cli.run(args)


def test_cli_export(cli_export, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    export_cli.add_arguments(parser)
    bad = parser.parse_args(["--format", "onnx", "--out", str(tmp_path)])
    assert export_cli.run(bad) == 2
    assert "--format" in capsys.readouterr().err
    # Timing left `mrcnn export`: the old flag names the harness command instead.
    moved = parser.parse_args(["--check", "--rounds", "1", "--out", str(tmp_path)])
    assert export_cli.run(moved) == 2
    assert "mrcnn-bench export-time" in capsys.readouterr().err
    out, _, returncode = cli_export
    assert returncode == 0
    report = json.loads((out / "export.json").read_text())
    assert report["meta"]["canvas"] == list(CANVAS) and report["meta"]["batch_size"] == 1
    assert report["check"]["valid_equal"] == {"exported": True}
    assert report["check"]["matched"]["exported"]["matched"] == 1.0
    assert "latency" not in report["check"] and "first_result_s" not in report["check"]
    assert (out / "sample.ppm").is_file()


def _export_time(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    export_timing.add_arguments(parser)
    return export_timing.run(parser.parse_args(argv))


def test_export_time_checks_and_times_packages(cli_export, tiny_weights, tmp_path, capsys):
    """``mrcnn-bench export-time``: outputs against eager, then eager and the package interleaved."""
    out, weights, _ = cli_export
    package = str(out / f"tiny_{CANVAS[0]}x{CANVAS[1]}_b1.exported.pt2")
    common = ["--weights", str(weights), "--image", str(out / "sample.ppm")]
    assert _export_time([package, *common, "--rounds", "1", "--out", str(tmp_path / "t.json")]) == 0
    report = json.loads((tmp_path / "t.json").read_text())
    assert report["valid_equal"] == {"exported": True} and report["mismatches"] == []
    assert set(report["latency"]) == {"eager (ops_impl=tensor)", "eager (ops_impl=auto)", "exported"}
    assert all(t["rounds"] == 1 and t["median_s"] > 0 for t in report["latency"].values())
    assert set(report["first_result_s"]) == set(report["load_s"]) == {"exported"}
    assert report["meta"]["canvas"] == list(CANVAS)
    capsys.readouterr()

    # Other weights than the package's: the outputs differ, exit 1 naming the package.
    other = {k: v.clone() for k, v in tiny_weights.items()}
    other["roi_heads.box_predictor.cls_score.bias"][1:] += 3.0
    torch.save(other, tmp_path / "other.pt")
    assert _export_time([package, "--weights", str(tmp_path / "other.pt"), "--image", common[3], "--rounds", "1"]) == 1
    assert "outputs differ from eager: exported:" in capsys.readouterr().err

    # Bad input: exit 2 with one line naming the problem, before anything is loaded or timed.
    for argv, problem in (([str(tmp_path / "missing.pt2"), *common], "package not found"),
                          ([package, *common, "--rounds", "0"], "--rounds must be >= 1"),
                          ([package, package, *common], "two exported packages"),
                          ([package, "--image", str(tmp_path / "none.ppm")], "--image: no such file")):
        assert _export_time(argv) == 2, argv
        err = capsys.readouterr().err
        assert problem in err and len(err.strip().splitlines()) == 1, err


def test_package_metadata_reads_without_loading_and_tolerates_old_config_keys(exported_path):
    meta = read_meta(exported_path)
    assert meta == load_exported(exported_path).meta
    assert meta.format == "exported" and meta.canvas == CANVAS and meta.cfg.name == "tiny"
    assert "inject_slowdown" not in meta.config  # no benchmark knob travels with a package
    # A package written when Config had a field it no longer has still loads.
    old = dataclasses.replace(meta, config={**meta.config, "inject_slowdown": 0.0, "gone_field": 3})
    assert old.cfg == meta.cfg
    assert type(meta).from_json(old.to_json()).cfg == meta.cfg


# ------------------------------------------------------------------------------------------------
# AOTInductor package, in Python and from C++


@pytest.mark.slow
def test_aoti_package_matches_eager(aoti_path, batch, eager_outputs):
    deployed = load_exported(aoti_path)
    assert deployed.format == "aoti"
    # Everything is compiled in or called through libtorch's C shim: no op is looked up by name.
    assert aoti_extern_ops(aoti_path) == []
    check_aoti_package(aoti_path)
    metadata = deployed._runner.get_metadata()
    assert metadata["mrcnn.canvas_height"] == "320" and metadata["mrcnn.canvas_width"] == "448"
    assert metadata["mrcnn.batch_size"] == "1"
    out = deployed(batch.tensors, batch.image_sizes)
    for e, a in zip(eager_outputs, out):
        assert a.shape == e.shape and a.dtype == e.dtype
    # Inductor's fused kernels round differently from eager's, so near-equal scores may swap ranks:
    # compare the detections as sets, and the sorted scores.
    stats = match_outputs(eager_outputs, out)
    assert stats["matched"] == 1.0 and stats["expected"] == stats["actual"] > 10, stats
    assert stats["min_mask_iou"] > 0.95, stats
    torch.testing.assert_close(out[1].sort(dim=1).values, eager_outputs[1].sort(dim=1).values, atol=1e-4, rtol=0)
    # The compiled graph trusts its inputs; the wrapper must not let a wrong shape through, and
    # must hand it the contiguous layout it was compiled for.
    with pytest.raises(ValueError, match=r"wrong batch size.*\[1, 3, 320, 448\].*got a batch of 2"):
        deployed(batch.tensors.expand(2, -1, -1, -1), batch.image_sizes.expand(2, -1))
    with pytest.raises(ValueError, match=r"wrong canvas size: this aoti package .*320x448.*got images of canvas 352x"):
        deployed(torch.zeros(1, 3, 352, 448), batch.image_sizes)
    with pytest.raises(ValueError, match=r"wrong dtype.*torch\.float32.*got images of dtype torch\.bfloat16"):
        deployed(batch.tensors.bfloat16(), batch.image_sizes)
    channels_last = deployed(batch.tensors.to(memory_format=torch.channels_last), batch.image_sizes)
    for a, b in zip(out, channels_last):
        assert torch.equal(a, b)


class _TorchvisionNms(torch.nn.Module):
    def forward(self, boxes, scores):
        valid = scores > 0.1
        keep, keep_valid = torch.ops.mrcnn.nms_fixed_tv(boxes, scores, valid, torch.zeros_like(valid).long(), 0.5, 4)
        return keep * 2, keep_valid


@pytest.mark.slow
def test_check_aoti_package_rejects_python_kernel_ops(tmp_path):
    """A package built from a graph with a Python-kernel op calls it by name: the check must see it."""
    from torch._inductor import aoti_compile_and_package, aoti_load_package

    gen = torch.Generator().manual_seed(0)
    boxes = torch.rand(1, 8, 4, generator=gen) * 10
    boxes[..., 2:] += boxes[..., :2] + 1
    scores = torch.rand(1, 8, generator=gen)
    ep = torch.export.export(_TorchvisionNms(), (boxes, scores))
    path = aoti_compile_and_package(ep, package_path=str(tmp_path / "tv.pt2"))
    # It does run here, where Python registered the op's kernel; a C++ process would not find it.
    assert torch.equal(aoti_load_package(path)(boxes, scores)[0], _TorchvisionNms()(boxes, scores)[0])
    assert aoti_extern_ops(path) == ["mrcnn::nms_fixed_tv"]
    with pytest.raises(RuntimeError, match=r"calls ops C\+\+ could not run: mrcnn::nms_fixed_tv, not an aten op"):
        check_aoti_package(path)


def test_aoti_extern_ops_reads_the_package_layout(tmp_path):
    def package(files: dict[str, str]) -> Path:
        path = tmp_path / f"p{len(list(tmp_path.iterdir()))}.pt2"
        with zipfile.ZipFile(path, "w") as z:
            for name, text in files.items():
                z.writestr(f"p/data/aotinductor/model/{name}", text)
        return path

    call = "aoti_torch_proxy_executor_call_function(proxy_executor, 0, 0, nullptr, 2, handles);"
    nodes = {"nodes": [{"name": "buf1", "node": {"target": "aten::add.Tensor"}},
                       {"name": "buf2", "node": {"target": "prims::convert_element_type"}}]}
    ok = package({"a.wrapper.cpp": "void run() {}", "a.wrapper_metadata.json": '{"AOTI_DEVICE_KEY": "cpu"}'})
    assert aoti_extern_ops(ok) == []
    check_aoti_package(ok)
    mixed = package({"a.wrapper.cpp": call * 2, "a.wrapper.json": json.dumps(nodes)})
    assert aoti_extern_ops(mixed) == ["aten::add.Tensor", "prims::convert_element_type"]
    # aten::add.Tensor has libtorch kernels; the prims op has Python ones only.
    with pytest.raises(RuntimeError, match=r"prims::convert_element_type, not an aten op") as err:
        check_aoti_package(mixed)
    assert "aten::add" not in str(err.value)
    with pytest.raises(ValueError, match="2 proxy-executor calls but no extern node"):
        aoti_extern_ops(package({"a.wrapper.cpp": call * 2}))


def _cpp_tools_missing() -> str | None:
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    return f"{' and '.join(missing)} not found on PATH" if missing else None


_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s*$")


def parse_cpp_detections(text: str) -> dict[str, torch.Tensor]:
    rows = [m.groups() for m in map(_ROW.match, text.splitlines()) if m]
    return {
        "labels": torch.tensor([int(r[1]) for r in rows], dtype=torch.int64),
        "scores": torch.tensor([float(r[2]) for r in rows]),
        "boxes": torch.tensor([[float(v) for v in r[3:]] for r in rows]).reshape(-1, 4),
    }


@pytest.mark.slow
def test_cpp_example_builds_and_matches_python(aoti_path, image, tmp_path):
    reason = _cpp_tools_missing()
    if reason:
        pytest.skip(f"C++ example not built: {reason}")
    build = tmp_path / "build"
    configure = subprocess.run(
        ["cmake", "-S", str(ROOT / "cpp"), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
         f"-DPYTHON_EXECUTABLE={sys.executable}"],
        capture_output=True, text=True, timeout=600,
    )
    assert configure.returncode == 0, configure.stdout[-2000:] + configure.stderr[-3000:]
    compiled = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True, timeout=900)
    assert compiled.returncode == 0, compiled.stdout[-3000:] + compiled.stderr[-3000:]
    exe = build / "mrcnn_aoti_example"

    # A Python-free process: no PYTHONPATH, nothing but the package and the image.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run([str(exe), str(aoti_path), str(image[1])], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "canvas 320x448" in proc.stdout and "resized to 320x426" in proc.stdout
    got = parse_cpp_detections(proc.stdout)
    (want,) = load_exported(aoti_path).predict([image[0]])
    assert len(want["labels"]) > 10
    # Same compiled model, same transform: the same detections, up to the printed precision
    # (5 decimals for scores, 3 for boxes), paired as sets in case two equal scores print apart.
    parity = match_detections(want, got, iou_min=0.999, score_tol=2e-5)
    assert parity.matched == parity.num_ref == parity.num_other, parity
    torch.testing.assert_close(got["scores"], want["scores"], atol=2e-5, rtol=0)

    # An image that does not fit the package's canvas: a clear error, no run.
    big = write_ppm(tmp_path / "wide.ppm", torch.zeros(3, 240, 400, dtype=torch.uint8))
    proc = subprocess.run([str(exe), str(aoti_path), str(big)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 2
    assert "resizes to 307x512, which does not fit this package's canvas 320x448" in proc.stderr
