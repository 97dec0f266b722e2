"""mtcnn's ONet as a SavedModel, and face crops from real photos to calibrate and evaluate it.

- The model: the `mtcnn` package's own `ONet` class with the trained weights its wheel ships
  (`mtcnn/assets/weights/onet.lz4`), built and loaded exactly as its `StageONet` does,
  exported as a TF SavedModel: input `image` (N, 48, 48, 3), outputs `box` (N, 4, box
  regression), `landmarks` (N, 10) and `face_prob` (N, 2, softmax: [not face, face]).
- The data: photos that scikit-image (`skimage.data`: astronaut, camera, the LFW subset...)
  and scikit-learn (`load_sample_images`) ship. mtcnn's own detector
  (`MTCNN().detect_faces`) finds the faces; each face gives crops with small shifts, scales
  and flips, and a few shifted far enough to be partial faces; backgrounds and LFW's
  non-face images give non-face crops, so the face probability spans 0..1. Crops are cut
  and resized to 48x48 with the package's own preprocessing (`normalize_images`, then
  `extract_patches`: what the detector feeds ONet). Faces are split between calibration and
  evaluation by person (and background crops by photo region), never sharing a crop.

    .venv/bin/python benchmarks/onet_data.py OUT_DIR [--quick]   # saved_model/, data.npz,
                                                                  # facts.json

--quick: fewer photos (the two full photos with faces, two backgrounds, 10 LFW faces and 10
LFW non-faces), so fewer crops; the same model.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402

SEED = 20240
SIZE = 48
INPUT_NAME = "image"
OUTPUT_NAMES = ("box", "landmarks", "face_prob")  # ONet's own order
FACE_CONFIDENCE = 0.95   # a detection at least this sure is a face
LFW_UPSCALE = 100        # LFW subset's 25x25 crops, upscaled so the detector finds them
LFW_PAD = 30             # edge padding around them (a face filling the frame is missed)
PHOTO_FACE_CROPS = 24    # crops per face found in a full photo (astronaut, camera)
BACKGROUND_CROPS = 12    # non-face crops per photo
FACE_PHOTOS = ("astronaut", "camera")
BACKGROUND_PHOTOS = ("coffee", "chelsea", "rocket", "hubble_deep_field", "coins",
                     "immunohistochemistry")


def build_onet():  # noqa: ANN201
    """The package's ONet with its shipped weights, as `StageONet.__init__` builds it."""
    from mtcnn.network.onet import ONet
    from mtcnn.utils.tensorflow import load_weights

    model = ONet()
    model.build()
    model.set_weights(load_weights("onet.lz4"))
    return model


def export_saved_model(model: Any, folder: Path) -> None:
    """A SavedModel whose serving signature takes `image` and names ONet's three outputs."""
    import tensorflow as tf

    class Exported(tf.Module):
        def __init__(self, net: Any) -> None:
            super().__init__()
            self.net = net

        @tf.function(input_signature=[tf.TensorSpec([None, SIZE, SIZE, 3], tf.float32,
                                                    name=INPUT_NAME)])
        def serve(self, image: tf.Tensor) -> dict[str, tf.Tensor]:
            return dict(zip(OUTPUT_NAMES, self.net(image), strict=True))

    module = Exported(model)
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.serve})


@dataclass
class Photo:
    name: str
    pixels: np.ndarray        # (H, W, 3) float32, 0..255
    kind: str                 # "face" (detect faces in it) or "background"


QUICK_LFW = 10           # --quick: LFW faces and LFW non-faces each
QUICK_BACKGROUNDS = 2    # --quick: background photos


def photos(quick: bool = False) -> list[Photo]:
    """The photos the libraries ship: two with faces, the LFW subset (100 faces, 100
    non-faces), and backgrounds (quick: fewer of each)."""
    import skimage.data
    import tensorflow as tf
    from sklearn.datasets import load_sample_images

    def rgb(image: np.ndarray) -> np.ndarray:
        image = np.asarray(image, dtype=np.float32)
        return np.repeat(image[..., None], 3, axis=-1) if image.ndim == 2 else image[..., :3]

    found = [Photo(n, rgb(getattr(skimage.data, n)()), "face") for n in FACE_PHOTOS]
    found += [Photo(n, rgb(getattr(skimage.data, n)()), "background")
              for n in BACKGROUND_PHOTOS[:QUICK_BACKGROUNDS if quick else None]]
    if not quick:
        samples = load_sample_images()
        found += [Photo(Path(f).stem, rgb(im), "background")
                  for f, im in zip(samples.filenames, samples.images, strict=True)]
    lfw = tf.image.resize(skimage.data.lfw_subset()[..., None] * 255.0,
                          (LFW_UPSCALE, LFW_UPSCALE), method="bilinear").numpy()
    for i, face in enumerate(lfw):
        if quick and i % 100 >= QUICK_LFW:
            continue
        if i < 100:  # the subset's first half are faces: pad so the detector sees context
            face = np.pad(face, ((LFW_PAD, LFW_PAD), (LFW_PAD, LFW_PAD), (0, 0)), mode="edge")
        found.append(Photo(f"lfw{i:03d}", rgb(face[..., 0]), "face" if i < 100 else "lfw_nonface"))
    return found


def square(box: tuple[float, float, float, float]) -> tuple[float, float, float]:
    """A detector box (x, y, w, h) -> centre x, centre y and side, squared as mtcnn does
    before ONet (side = the longer edge)."""
    x, y, w, h = box
    return x + w / 2, y + h / 2, max(w, h)


def crop(photo: Photo, boxes: list[tuple[float, float, float]], flips: list[bool]
         ) -> np.ndarray:
    """48x48 crops of (centre x, centre y, side) squares, with mtcnn's preprocessing."""
    from mtcnn.utils.images import extract_patches, normalize_images

    image = normalize_images(photo.pixels)[None]
    rows = np.array([[0, cx - s / 2, cy - s / 2, cx + s / 2, cy + s / 2]
                     for cx, cy, s in boxes], dtype=np.float64)
    patches = extract_patches(image, rows, expected_size=(SIZE, SIZE)).numpy()
    return np.stack([p[:, ::-1] if f else p for p, f in zip(patches, flips, strict=True)])


def face_crops(photo: Photo, face: tuple[float, float, float], count: int,
               rng: np.random.Generator) -> tuple[list[tuple[float, float, float]], list[bool],
                                                  list[str]]:
    """The face itself, then jittered crops (shift <= 10% of the side, scale 0.85..1.2,
    half flipped), the last third shifted 25..45% of the side (partial faces)."""
    cx, cy, side = face
    boxes, flips, kinds = [(cx, cy, side)], [False], ["face"]
    for i in range(1, count):
        partial = i >= count - max(1, count // 3)
        reach = rng.uniform(0.25, 0.45) if partial else 0.10
        angle = rng.uniform(0, 2 * np.pi)
        shift = side * (reach if partial else rng.uniform(0, reach))
        scale = rng.uniform(0.85, 1.2)
        boxes.append((cx + shift * np.cos(angle), cy + shift * np.sin(angle), side * scale))
        flips.append(bool(rng.integers(2)))
        kinds.append("partial" if partial else "face")
    return boxes, flips, kinds


def background_crops(photo: Photo, count: int, rng: np.random.Generator
                     ) -> list[tuple[float, float, float]]:
    height, width = photo.pixels.shape[:2]
    boxes = []
    for _ in range(count):
        side = rng.uniform(0.1, 0.5) * min(height, width)
        boxes.append((rng.uniform(side / 2, width - side / 2),
                      rng.uniform(side / 2, height - side / 2), side))
    return boxes


def make_data(quick: bool = False) -> dict[str, Any]:
    """Crops (N, 48, 48, 3), their kind and group, and what the detector found."""
    from mtcnn import MTCNN

    rng = np.random.default_rng(SEED)
    detector = MTCNN()
    images: list[np.ndarray] = []
    kinds: list[str] = []
    groups: list[str] = []
    found: dict[str, Any] = {}

    def add(photo: Photo, boxes: list, flips: list[bool], crop_kinds: list[str],
            group: str) -> None:
        images.append(crop(photo, boxes, flips))
        kinds.extend(crop_kinds)
        groups.extend([group] * len(boxes))

    for photo in photos(quick):
        if photo.kind == "lfw_nonface":  # the whole (upscaled) picture, as LFW cut it
            side = float(photo.pixels.shape[0])
            add(photo, [(side / 2, side / 2, side)], [False], ["background"], photo.name)
            continue
        detections = detector.detect_faces(photo.pixels.astype(np.uint8))
        faces = [d for d in detections if d["confidence"] >= FACE_CONFIDENCE]
        # a full photo's unsure detection is a hard non-face (china.jpg's temple roof);
        # an LFW face is a face however unsure the detector is, so not one of those
        unsure = [d for d in detections if d["confidence"] < FACE_CONFIDENCE
                  and not photo.name.startswith("lfw")]
        found[photo.name] = [[round(float(v), 1) for v in d["box"]] + [round(d["confidence"], 4)]
                             for d in detections]
        for k, face in enumerate(faces):
            count = 3 if photo.name.startswith("lfw") else PHOTO_FACE_CROPS
            boxes, flips, crop_kinds = face_crops(photo, square(face["box"]), count, rng)
            if photo.name.startswith("lfw"):
                add(photo, boxes, flips, crop_kinds, photo.name)  # split by person
            else:  # one person: split the crops between calibration and evaluation
                for j in range(count):
                    add(photo, boxes[j:j + 1], flips[j:j + 1], crop_kinds[j:j + 1],
                        f"{photo.name}-{k}-{j % 2}")
        for k, hard in enumerate(unsure):
            boxes, flips, _ = face_crops(photo, square(hard["box"]), 8, rng)
            for j in range(len(boxes)):
                add(photo, boxes[j:j + 1], flips[j:j + 1], ["hard_negative"],
                    f"{photo.name}-hard{k}-{j % 2}")
        if photo.kind == "background":
            for j, box in enumerate(background_crops(photo, BACKGROUND_CROPS, rng)):
                add(photo, [box], [bool(rng.integers(2))], ["background"],
                    f"{photo.name}-{j % 2}")
    return {"x": np.concatenate(images).astype(np.float32), "kinds": np.array(kinds),
            "groups": np.array(groups), "detections": found}


def split(groups: np.ndarray, calib_share: float = 0.4) -> np.ndarray:
    """True for calibration rows: a seeded choice of whole groups (a person, or one half of
    a photo's crops), so no face is in both sets."""
    rng = np.random.default_rng(SEED)
    names = np.unique(groups)
    chosen = set(rng.permutation(names)[:round(calib_share * len(names))])
    return np.array([g in chosen for g in groups])


def make(out: Path, quick: bool = False) -> dict[str, Any]:
    """Write out/saved_model, out/data.npz (x_calib, x_eval, the crops' kinds, and ONet's
    float outputs on x_eval as ref_box, ref_landmarks, ref_face_prob) and out/facts.json;
    return the facts."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(SEED)
    out.mkdir(parents=True, exist_ok=True)
    model = build_onet()
    export_saved_model(model, out / "saved_model")
    data = make_data(quick)
    calib = split(data["groups"])
    x_calib, x_eval = data["x"][calib], data["x"][~calib]
    # the package's own Keras model's outputs on the evaluation crops: the float reference
    reference = {f"ref_{name}": value.numpy()
                 for name, value in zip(OUTPUT_NAMES, model(x_eval), strict=True)}
    np.savez(out / "data.npz", x_calib=x_calib, x_eval=x_eval,
             kinds_calib=data["kinds"][calib], kinds_eval=data["kinds"][~calib], **reference)
    prob = reference["ref_face_prob"][:, 1]
    kinds, counts = np.unique(data["kinds"][~calib], return_counts=True)
    facts = {"params": int(model.count_params()),
             "calib": int(calib.sum()), "eval": int((~calib).sum()),
             "eval_kinds": {str(k): int(c) for k, c in zip(kinds, counts, strict=True)},
             "eval_face_share": float(np.mean(prob > 0.5)),
             "detections": {k: v for k, v in data["detections"].items()
                            if v and not k.startswith("lfw")},
             "lfw_faces_detected": sum(1 for k, v in data["detections"].items()
                                       if k.startswith("lfw") and v)}
    (out / "facts.json").write_text(json.dumps(facts, indent=1))
    return facts


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--quick", action="store_true", help="fewer photos, fewer crops")
    parsed = parser.parse_args()
    print(json.dumps(make(parsed.out, parsed.quick)))
