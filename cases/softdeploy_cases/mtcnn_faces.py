"""Second real case: the MTCNN face detector's P-Net, its boxes through Soft-NMS.

Model: MTCNN's proposal network (P-Net) with the weights of PyPI ``facenet-pytorch==2.6.0``
(``data/pnet.pt``, MIT; installed with --no-deps and never imported: it imports torchvision, which
does not load beside this torch). The architecture below copies facenet_pytorch's PNet (same
module names). Fully convolutional: ``image [N, 3, H, W]`` (RGB, (x - 127.5) / 128) ->
``(box offsets [N, 4, h, w], face probability [N, 2, h, w])``, one 12x12 window per output cell,
stride 2.

Tasks (scikit-image's bundled images):
  * face / non-face on ``skimage.data.lfw_subset()`` (100 faces, then 100 non-faces, 25x25 grey):
    a crop's face score is the best cell's face probability; metrics: ROC AUC and accuracy at 0.5.
  * detection on photos (astronaut, and matplotlib's grace_hopper): image pyramid (smallest face
    20 px, factor 0.709), cells with face probability >= 0.6 become boxes (offsets applied), and
    gaussian Soft-NMS keeps the detections with score >= 0.5. Metric: F1 of the detections against
    those of the torch fp32 model (IoU >= 0.5) -- there is no box ground truth in these packages.
Calibration uses other photos (chelsea, coffee, camera, rocket), never the evaluation images.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from softdeploy.compare.case import Evaluation, Floor, Progress, Runner, Timed
from softdeploy.models.detection import SoftNMSRunner, iou_one_to_many
from softdeploy_cases.assets import package_dir

MIN_FACE = 20
FACTOR = 0.709
CELL_THRESHOLD = 0.6
DETECTION_THRESHOLD = 0.5


def _pnet() -> Any:
    import torch
    from torch import nn

    class PNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 10, kernel_size=3)
            self.prelu1 = nn.PReLU(10)
            self.pool1 = nn.MaxPool2d(2, 2, ceil_mode=True)
            self.conv2 = nn.Conv2d(10, 16, kernel_size=3)
            self.prelu2 = nn.PReLU(16)
            self.conv3 = nn.Conv2d(16, 32, kernel_size=3)
            self.prelu3 = nn.PReLU(32)
            self.conv4_1 = nn.Conv2d(32, 2, kernel_size=1)
            self.softmax4_1 = nn.Softmax(dim=1)
            self.conv4_2 = nn.Conv2d(32, 4, kernel_size=1)

        def forward(self, x: Any) -> Any:
            x = self.prelu1(self.conv1(x))
            x = self.pool1(x)
            x = self.prelu3(self.conv3(self.prelu2(self.conv2(x))))
            return self.conv4_2(x), self.softmax4_1(self.conv4_1(x))

    net = PNet().eval()
    state = torch.load(package_dir("facenet_pytorch") / "data" / "pnet.pt", map_location="cpu", weights_only=True)
    net.load_state_dict(state)
    return net


def _normalise(rgb_uint8: np.ndarray) -> np.ndarray:
    x = rgb_uint8.astype(np.float32)
    if x.ndim == 2:
        x = np.repeat(x[..., None], 3, axis=2)
    return ((x[..., :3] - 127.5) / 128.0).transpose(2, 0, 1)[None].copy()


def _pyramid(image: np.ndarray) -> list[tuple[float, np.ndarray]]:
    """(scale, normalised [1, 3, h, w]) levels of an RGB uint8 image."""
    import torch

    h, w = image.shape[:2]
    x = torch.from_numpy(_normalise(image))
    scale = 12.0 / MIN_FACE
    levels = []
    while min(h, w) * scale >= 12:
        size = (int(h * scale + 1), int(w * scale + 1))
        levels.append((scale, torch.nn.functional.interpolate(x, size=size, mode="area").numpy()))
        scale *= FACTOR
    return levels


def _candidates(offsets: np.ndarray, probs: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Boxes [k, 4] as [y1, x1, y2, x2] in image pixels, and their scores, of one pyramid level."""
    face = probs[0, 1]
    ys, xs = np.nonzero(face >= CELL_THRESHOLD)
    if len(ys) == 0:
        return np.zeros((0, 4), np.float32), np.zeros(0, np.float32)
    x1 = np.floor((2 * xs + 1) / scale)
    y1 = np.floor((2 * ys + 1) / scale)
    x2 = np.floor((2 * xs + 12) / scale)
    y2 = np.floor((2 * ys + 12) / scale)
    bw, bh = x2 - x1, y2 - y1
    dx1, dy1, dx2, dy2 = (offsets[0, c, ys, xs] for c in range(4))
    boxes = np.stack([y1 + dy1 * bh, x1 + dx1 * bw, y2 + dy2 * bh, x2 + dx2 * bw], axis=1)
    return boxes.astype(np.float32), face[ys, xs].astype(np.float32)


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Probability that a random positive outscores a random negative (ties count half)."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(pos) * len(neg)))


def box_f1(found: list[np.ndarray], reference: list[np.ndarray], iou: float = 0.5) -> float:
    """F1 of detections against reference detections over several images (greedy matching)."""
    tp = fp = fn = 0
    for boxes, ref in zip(found, reference, strict=True):
        unmatched = list(range(len(ref)))
        for b in boxes:
            if unmatched:
                ious = iou_one_to_many(b, ref[unmatched])
                j = int(np.argmax(ious))
                if ious[j] >= iou:
                    unmatched.pop(j)
                    tp += 1
                    continue
            fp += 1
        fn += len(unmatched)
    return 1.0 if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)


class MtcnnFaces:
    """The detection compare case: MTCNN's P-Net (facenet-pytorch weights) on scikit-image photos and LFW crops, its
    candidate boxes through the SoftNMS op; metrics face AUC, accuracy, box F1 vs fp32 and detections."""

    name = "mtcnn_faces"
    title = "MTCNN P-Net face detection with Soft-NMS on scikit-image photos and LFW crops"
    primary_metric = "face AUC"
    metric_names = ("face AUC", "face accuracy", "box F1 vs fp32", "detections")
    agreement_k = 1
    cosine_name = "prob-map cosine"
    timed_phases = ("pnet pyramid", "soft-nms")

    def __init__(self) -> None:
        self._net: Any = None
        self._crops: np.ndarray | None = None
        self._labels: np.ndarray | None = None
        self._photos: dict[str, np.ndarray] = {}
        self._calibration: dict[str, np.ndarray] = {}
        self._reference: list[np.ndarray] | None = None
        self._nms: dict[tuple[str, int], SoftNMSRunner] = {}

    def prepare(self, progress: Progress) -> None:
        """Loads P-Net, the LFW crops and labels, the photos and the calibration images; a second call does nothing."""
        if self._net is not None:
            return
        with progress.step("load MTCNN P-Net (facenet-pytorch weights) and scikit-image photos"):
            import matplotlib.cbook
            import skimage.data
            import skimage.io

            self._net = _pnet()
            crops = skimage.data.lfw_subset()  # float in [0, 1], 200 x 25 x 25
            self._crops = np.concatenate([_normalise((c * 255).astype(np.uint8)) for c in crops])
            self._labels = (np.arange(len(crops)) < 100).astype(np.int64)
            with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as f:
                hopper = skimage.io.imread(f)
            self._photos = {"astronaut": skimage.data.astronaut(), "grace_hopper": hopper}
            self._calibration = {n: getattr(skimage.data, n)() for n in ("chelsea", "coffee", "camera", "rocket")}
            self._reference = self._detect(self.torch_runner(1), self.nms("native-reference", 1))

    def describe(self) -> dict[str, Any]:
        """Model, data, post-processing and calibration settings, for the report."""
        return {
            "model": "MTCNN P-Net (facenet-pytorch==2.6.0 weights data/pnet.pt)",
            "data": "skimage lfw_subset (100 faces + 100 non-faces, 25x25); photos astronaut, grace_hopper",
            "post-processing": f"gaussian Soft-NMS (sigma 0.5) of cells with face prob >= {CELL_THRESHOLD}, "
            f"detections >= {DETECTION_THRESHOLD}",
            "calibration": "pyramids of skimage chelsea, coffee, camera, rocket",
        }

    def fingerprint(self) -> str:
        """Weights and settings: the key of the cached fp32 export (softdeploy.compare.cache)."""
        from softdeploy.compare.cache import fingerprint

        return fingerprint(self._net, self.describe())

    def torch_size_bytes(self) -> int:
        """P-Net's parameter bytes."""
        return sum(p.numel() * p.element_size() for p in self._net.parameters())

    def export_fp32(self, path: Path) -> None:
        """Exports P-Net with dynamic batch, height and width to ``path``."""
        import torch

        from softdeploy.export.torch_export import export_module

        n, h, w = (torch.export.Dim(k, min=1 if k == "n" else 12, max=4096) for k in ("n", "h", "w"))
        export_module(
            self._net,
            (torch.zeros(2, 3, 40, 52),),
            path,
            dynamic_shapes={"x": {0: n, 2: h, 3: w}},
            input_names=["image"],
            output_names=["box_offsets", "face_prob"],
            overwrite=True,
        )

    def torch_runner(self, threads: int) -> Runner:
        """Eager P-Net over {'image': ...} feeds."""
        import torch

        net = self._net

        def run(feeds: Any) -> list[np.ndarray]:
            with torch.inference_mode():
                return [o.numpy() for o in net(torch.from_numpy(feeds["image"]))]

        return run

    def calibration_feeds(self) -> list[dict[str, np.ndarray]]:
        """The first six pyramid levels of each calibration photo (held apart from the evaluation images)."""
        return [{"image": level} for img in self._calibration.values() for _, level in _pyramid(img)[:6]]

    def probe_feeds(self) -> list[dict[str, np.ndarray]]:
        """64 LFW crops, for the sensitivity probe."""
        return [{"image": self._crops[:64]}] if self._crops is not None else []

    def nms(self, kernels: str, threads: int) -> SoftNMSRunner:
        """The SoftNMS runner for ``kernels`` / ``threads``, built once and reused."""
        backend = "native" if kernels == "native-reference" else kernels
        key = (kernels, threads)
        if key not in self._nms:
            self._nms[key] = SoftNMSRunner(backend, threads=threads)  # type: ignore[arg-type]
        return self._nms[key]

    def _candidates(self, runner: Runner, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        boxes, scores = [], []
        for scale, level in _pyramid(image):
            offsets, probs = runner({"image": level})
            b, s = _candidates(offsets, probs, scale)
            boxes.append(b)
            scores.append(s)
        return np.concatenate(boxes), np.concatenate(scores)

    def _detect(self, runner: Runner, nms: SoftNMSRunner) -> list[np.ndarray]:
        out = []
        for image in self._photos.values():
            boxes, scores = self._candidates(runner, image)
            keep, kept_scores = nms(boxes, scores)
            out.append(boxes[keep[kept_scores >= DETECTION_THRESHOLD]])
        return out

    def evaluate(self, runner: Runner, kernels: str, progress: Progress, label: str) -> Evaluation:
        """Face probability of every LFW crop (AUC, accuracy) and detection on the photos through SoftNMS (F1 of the
        boxes against fp32's)."""
        assert self._crops is not None and self._labels is not None and self._reference is not None
        with progress.step(f"{label}: LFW crops and photo detection"):
            _, probs = runner({"image": self._crops})
            face = probs[:, 1].reshape(len(probs), -1).max(axis=1)
            nms = self.nms(kernels, 1)
            found = self._detect(runner, nms)
        eps = 1e-7
        two_class = np.log(np.stack([1 - face + eps, face + eps], axis=1))
        return Evaluation(
            metrics={
                "face AUC": roc_auc(face, self._labels),
                "face accuracy": float(((face >= 0.5) == (self._labels == 1)).mean()),
                "box F1 vs fp32": box_f1(found, self._reference),
                "detections": float(sum(len(f) for f in found)),
            },
            rows={"prob-map cosine": probs[:, 1].reshape(len(probs), -1)},
            scores=two_class,
            notes={"post-processing": nms.backend},
        )

    def timed(self, runner: Runner, kernels: str, threads: int) -> dict[str, Timed]:
        """Latency of P-Net over one photo's pyramid and of SoftNMS over its candidates."""
        image = self._photos["astronaut"]
        levels = _pyramid(image)
        nms = self.nms(kernels, threads)
        boxes, scores = self._candidates(runner, image)

        def pyramid() -> None:
            for _, level in levels:
                runner({"image": level})

        return {"pnet pyramid": Timed(pyramid, 1), "soft-nms": Timed(lambda: nms(boxes, scores), 1)}

    def floors(self, rows: list[dict[str, Any]]) -> list[Floor]:
        """Every int8 variant's face AUC within 0.01 of fp32, and Soft-NMS running as the com.softdeploy op with the
        native kernel."""
        ref = next(r for r in rows if r["variant"] == "ort-fp32")
        out = []
        for r in rows:
            if r["precision"] != "int8":
                continue
            drop = ref["face AUC"] - r["face AUC"]
            out.append(Floor(f"{r['variant']}: face AUC drop vs fp32", drop, "<= 0.01", drop <= 0.01))
        nms = str(ref.get("post-processing", ""))
        out.append(Floor("Soft-NMS runs the com.softdeploy SoftNMS op", None, "SoftNMS op (native kernel)",
                         nms == "SoftNMS op (native kernel)", nms))  # fmt: skip
        return out
