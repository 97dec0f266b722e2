"""Image-folder data sources: every image under the folder, recursively in sorted order,
read with Pillow one file at a time: converted to `channels` (1 = grey, 3 = RGB), resized
to `resize` = [height, width] (bilinear; both default to the model input's), then
`(x - mean) / std`, as label_image's --input_mean/--input_std. Files without an image
extension are skipped with a warning; an evaluation's `labels` file names the classes, one
per line, and an image's label is the line of its parent folder's name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator import paths
from orchestrator.data.source import Chunk, LoadStats, Role, hash_file, log, source_path
from orchestrator.errors import DataError
from orchestrator.limits import MAX_IMAGE_FOLDER_FILES
from orchestrator.model.artifact import TensorSpec
from orchestrator.spec.models import DataSource

# Raster formats only: Pillow also "opens" .h5, .eps, .mpg..., which are not images here.
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".bmp", ".dib",
                              ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm",
                              ".pnm", ".tga"})


def check(source: DataSource, base_dir: Path, role: Role, field_path: str,
          input_spec: TensorSpec | None) -> None:
    """The folder has images (by name) and the labels file, when asked, class names."""
    path = source_path(source, base_dir)
    try:
        found = any(has_image_name(f) and paths.path_problem(f, "file") is None
                    for f in _names(path))  # the first image will do: no stat of the rest
    except ValueError as exc:
        raise DataError(str(exc), file=str(path), field=f"{field_path}.source") from exc
    if not found:
        raise DataError(f"no images in {path} (looked for "
                        f"{', '.join(sorted(IMAGE_EXTENSIONS))})", file=str(path),
                        field=f"{field_path}.source")
    if role == "evaluation" and source.labels:
        read_label_names(paths.resolve(source.labels, base_dir), f"{field_path}.labels")


def open_chunks(source: DataSource, base_dir: Path, role: Role, input_spec: TensorSpec | None,
                chunk_size: int, stats: LoadStats | None,
                field_path: str) -> tuple[Iterator[Chunk], str]:
    """The labels file read now; the images, one chunk each, lazily."""
    labeller = None
    if role == "evaluation" and source.labels:
        names = read_label_names(paths.resolve(source.labels, base_dir), f"{field_path}.labels")
        labeller = folder_labeller(names, source.labels, f"{field_path}.labels")
    return (images(source_path(source, base_dir), source, input_spec, stats, field_path,
                   labeller), f"{field_path}.source")


def hash_content(digest: Any, source: DataSource, base_dir: Path) -> None:
    """Sorted (relative name, size, mtime_ns) of every file, plus the labels file's bytes."""
    path = source_path(source, base_dir)
    for file in walk(path):
        stat = file.stat()
        digest.update(f"{file.relative_to(path).as_posix()}\0{stat.st_size}\0"
                      f"{stat.st_mtime_ns}\n".encode())
    if source.labels:
        hash_file(digest, paths.resolve(source.labels, base_dir))


def skipped_files(source: DataSource, base_dir: Path) -> list[str]:
    """Files an image-folder source skips (not images), found from names alone; [] for
    other sources. For the report, whether or not this run read the data (cache hits)."""
    path = paths.resolve(source.source, base_dir)
    if not path.is_dir():
        return []
    return [str(f) for f in walk(path) if f.suffix.lower() not in IMAGE_EXTENSIONS]


def has_image_name(file: Path) -> bool:
    return file.suffix.lower() in IMAGE_EXTENSIONS


def _names(folder: Path) -> Iterator[Path]:
    """Every file name under `folder`, folders in sorted order; ValueError past
    MAX_IMAGE_FOLDER_FILES (a source named `/` or `~` by mistake)."""
    count = 0
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        count += len(names)
        if count > MAX_IMAGE_FOLDER_FILES:
            raise ValueError(f"more than {MAX_IMAGE_FOLDER_FILES:,} files under {folder}: "
                             "name the folder that holds the images")
        yield from (Path(root) / n for n in sorted(names))


def walk(folder: Path) -> list[Path]:
    """Every regular file under `folder`, sorted by relative path. Only regular files: a
    FIFO among the images would hang the reader. ValueError past MAX_IMAGE_FOLDER_FILES."""
    files = [f for f in _names(folder) if paths.path_problem(f, "file") is None]
    return sorted(files, key=lambda f: f.relative_to(folder).as_posix())


def images(folder: Path, source: DataSource, spec: TensorSpec | None,
           stats: LoadStats | None, field_path: str,
           labeller: Callable[[Path], int] | None) -> Iterator[Chunk]:
    """One (1, H, W, C) chunk per image, read lazily."""
    channels, size = image_geometry(source, spec)
    first_shape = None
    for file in walk(folder):
        if file.suffix.lower() not in IMAGE_EXTENSIONS:
            log.warning("skipped %s: not an image", file)
            if stats is not None:
                stats.skipped.append(str(file))
            continue
        image = _read_image(file, channels, size, source, field_path)
        if first_shape is None:
            first_shape = image.shape
        elif image.shape != first_shape:
            raise DataError(f"image is {image.shape[1]}x{image.shape[0]}, the first was "
                            f"{first_shape[1]}x{first_shape[0]}: set `resize: [height, "
                            "width]`", file=str(file), field=f"{field_path}.resize")
        label = None if labeller is None else np.array([labeller(file)], dtype=np.int64)
        yield image[None], label


def image_geometry(source: DataSource,
                   spec: TensorSpec | None) -> tuple[int, tuple[int, int] | None]:
    """(channels, (height, width) or None): the source's, else the model input's."""
    shape = spec.shape if spec is not None and spec.shape and len(spec.shape) == 4 else None
    channels = source.channels
    if channels is None:
        channels = shape[3] if shape is not None and shape[3] in (1, 3) else 3
    size = tuple(source.resize) if source.resize else None
    if size is None and shape is not None and all(d and d > 0 for d in shape[1:3]):
        size = (int(shape[1]), int(shape[2]))
    return channels, size


def _read_image(file: Path, channels: int, size: tuple[int, int] | None,
                source: DataSource, field_path: str) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(file) as image:
            image = image.convert("L" if channels == 1 else "RGB")
            if size is not None and image.size != (size[1], size[0]):
                image = image.resize((size[1], size[0]), Image.Resampling.BILINEAR)
            array = np.asarray(image, dtype=np.float32)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DataError(f"cannot read image: {exc}", file=str(file),
                        field=f"{field_path}.source") from exc
    if channels == 1:
        array = array[..., None]
    return (array - source.mean) / source.std


def read_label_names(path: Path, field: str) -> list[str]:
    """The class names of a labels file, one per non-empty line."""
    try:
        text = paths.read_regular_file(path, 16 << 20).decode("utf-8")
        names = [line.strip() for line in text.splitlines() if line.strip()]
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read labels file: {exc}", file=str(path), field=field) from exc
    if not names:
        raise DataError("labels file is empty", file=str(path), field=field)
    return names


def folder_labeller(names: list[str], labels_file: str, field: str) -> Callable[[Path], int]:
    """An image's label: the index of its parent folder's name among `names`."""
    index = {name: i for i, name in enumerate(names)}

    def label(file: Path) -> int:
        if file.parent.name not in index:
            raise DataError(f"folder {file.parent.name!r} is not a class in {labels_file}",
                            file=str(file), field=field)
        return index[file.parent.name]

    return label
