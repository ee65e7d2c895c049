"""Decoding a streamed split's examples (data/stream.py): a record or file's bytes to the uint8 image a model sees.

    load_fn      (unit, record, data) -> (encoded image or raw pixels, 0-based label): the file read or the record
                 parsed, the label checked against the classes and a JPEG's structure checked before any decoder
                 sees it (``jpeg_structure``)
    pixels_fn    the decoded pixels a transform starts from: a JPEG's random box decoded alone, the centre square,
                 or the whole image
    decode_fn    the whole transform ``mode`` and ``train`` say, keyed by (seed, epoch, the example's position)
    fit_fn       the whole image resized to ``size``: what a split held in memory stores

Transforms (``mode``):

    inception    images of any size (ImageNet, folders of photos): training crops a random box of 8-100% of the
                 area and aspect 3/4-4/3 (Szegedy et al. 2015), decoding only that box of a JPEG
                 (``decode_and_crop_jpeg``), resizes it to ``size`` and flips at random; evaluation takes the
                 centre 87.5% square and resizes it. Without --augment training uses the evaluation transform.
    fixed        images of one size (a TFDS set of one declared shape, a folder of one size): decoded whole and
                 resized to ``size`` if they differ; --augment adds the in-memory path's flip and pad-and-crop
                 (pixels.augment)

Randomness is keyed, never drawn from a global state: every example's crop and flip come from a hash of (seed,
epoch, its position in the files), as in data/pipeline.py (data/pixels.py), so they do not depend on thread timing.

A JPEG cut short (or whose headers break off) is refused by the toolkit's own check before
TensorFlow's decoder sees it: libjpeg reports such files on the process's stderr ("Improper call to JPEG library
in state 201", "Input file read error"), in front of the one-line error the run then gives.
"""

from __future__ import annotations

import numpy as np

from .pixels import augment as augment_batch, augment_keys

# TensorFlow is imported inside the functions that build graph ops: ``import tftoolkit`` reaches this module
# (through training) and must not import TensorFlow (tftoolkit/__init__.py).

AREA = (0.08, 1.0)
ASPECT = (3 / 4, 4 / 3)
CROP_ATTEMPTS = 10    # boxes tried before the whole image is taken (tf.image.sample_distorted_bounding_box)
EVAL_CROP = 0.875     # the centre square's side over the shorter side (224 of 256)
DEFAULT_IMAGE_SIZE = 224  # --image-size for images of mixed sizes larger than it (ImageNet's)
MARK = "tftoolkit-bad-example"  # in the error a bad record raises: data.bad_records.explain_error finds it
JPEG_BROKEN = "JPEG headers broken"  # the reasons checked_encoding raises
JPEG_CUT_SHORT = "JPEG cut short"
MAX_JPEG_SEGMENTS = 256   # marker segments walked before the first scan (a camera JPEG has about 10-20)


def choose_image_size(given: int | None, sizes) -> tuple[int, str]:
    """The side images are decoded to, and why (logged, so a user who gave no --image-size sees what was picked).

    ``given`` when set; else, from the (width, height) of a sample of the images: the shorter side when they share
    one size; else the median shorter side, at most DEFAULT_IMAGE_SIZE (a folder of 20-60 px images is not blown up
    to 224); DEFAULT_IMAGE_SIZE when nothing could be sampled."""
    sizes = [tuple(int(v) for v in s) for s in sizes]
    if given:
        return given, f"{given} px (--image-size)"
    if not sizes:
        return DEFAULT_IMAGE_SIZE, f"{DEFAULT_IMAGE_SIZE} px (no image size could be sampled; set --image-size)"
    if len(set(sizes)) == 1:
        w, h = sizes[0]
        return min(sizes[0]), f"{min(sizes[0])} px (the images' shorter side: all {len(sizes)} sampled are {w}x{h})"
    shorter = [min(s) for s in sizes]
    median = int(np.median(shorter))
    size = min(DEFAULT_IMAGE_SIZE, median)
    cap = f", capped at {DEFAULT_IMAGE_SIZE}" if median > DEFAULT_IMAGE_SIZE else ""
    return size, (f"{size} px (the median shorter side of {len(sizes)} sampled images of mixed sizes, "
                  f"{min(shorter)}-{max(shorter)} px{cap}; set --image-size to choose)")


def jpeg_structure(encoded):
    """(the first scan's offset or -1, whether an end-of-image marker follows it, whether the headers are broken:
    something other than a marker where one should be) of a JPEG's bytes, in the graph.

    The marker segments are walked by their lengths from the start of image to the first start of scan, so an
    EXIF thumbnail (a whole JPEG inside an APP1 segment) is stepped over, not mistaken for the image; after that
    scan a 0xFF 0xD9 can only be a marker (the entropy-coded data stuffs every 0xFF with a 0x00). A file TensorFlow
    decodes has both; bytes after the end of image (a phone's appended video) are left alone, as the decoder
    leaves them."""
    import tensorflow as tf

    b = tf.cast(tf.io.decode_raw(encoded, tf.uint8), tf.int32)
    n = tf.size(b)
    pad = tf.concat([b, tf.zeros([4], tf.int32)], 0)  # reads at p+1..p+3 stay in range

    def walking(p, scan, i):
        return tf.logical_and(tf.logical_and(scan < 0, p >= 0), tf.logical_and(p + 1 < n, i < MAX_JPEG_SEGMENTS))

    def step(p, scan, i):
        marker = pad[p + 1]
        standalone = tf.logical_or(tf.logical_and(marker >= 0xD0, marker <= 0xD8), tf.equal(marker, 0x01))
        length = pad[p + 2] * 256 + pad[p + 3]
        nxt = tf.where(tf.equal(marker, 0xFF), p + 1, tf.where(standalone, p + 2, p + 2 + length))  # 0xFF: fill
        nxt = tf.where(tf.equal(pad[p], 0xFF), nxt, -1)  # not at a marker: the structure is broken
        sos = tf.equal(marker, 0xDA)
        return tf.where(sos, p, nxt), tf.where(sos, p, -1), i + 1

    start = tf.constant(0, tf.int32)
    p, scan, _ = tf.while_loop(walking, step, (start, tf.constant(-1, tf.int32), start))
    ends = tf.logical_and(tf.equal(b[:-1], 0xFF), tf.equal(b[1:], 0xD9))
    after = tf.range(tf.maximum(n - 1, 0)) > scan
    return scan, tf.logical_and(scan >= 0, tf.reduce_any(tf.logical_and(ends, after))), p < 0


def checked_encoding(encoded):
    """``encoded``, failing (with MARK and the reason) when it is a JPEG whose structure libjpeg would refuse."""
    import tensorflow as tf

    def walk():
        _, ends, broken = jpeg_structure(encoded)
        headers = tf.debugging.Assert(tf.logical_not(broken), [MARK, JPEG_BROKEN])
        with tf.control_dependencies([headers]):
            whole = tf.debugging.Assert(ends, [MARK, JPEG_CUT_SHORT])
        with tf.control_dependencies([whole]):
            return tf.identity(encoded)

    # Nearly every JPEG ends with its end-of-image marker: those pass on their last two bytes, and only the rest
    # (cut short, or with bytes after the marker) are walked (the walk costs about a decode).
    last = tf.strings.substr(encoded, tf.maximum(tf.strings.length(encoded) - 2, 0), 2)
    walked = tf.logical_and(tf.io.is_jpeg(encoded), tf.not_equal(last, tf.constant(b"\xff\xd9")))
    return tf.cond(walked, walk, lambda: tf.identity(encoded))


def load_fn(split):
    """(unit, record, data) -> (encoded image or raw pixels, 0-based label), checked against the classes, and a JPEG
    against its structure."""
    import tensorflow as tf

    labels = tf.constant(split.labels if split.labels is not None else np.zeros(0, np.int64), tf.int64)
    k, offset = split.num_classes, split.label_offset

    def load(unit, rec, data):
        if split.counts is None:
            encoded, label = tf.io.read_file(data), tf.gather(labels, unit)
        else:
            encoded, label = split.parse(data)
        if split.raw_shape is None:
            encoded = checked_encoding(encoded)
        label = tf.cast(label, tf.int64) - offset
        # Raised here, dropped by ignore_errors, named by the position check (explain says which label).
        check = tf.debugging.Assert(tf.logical_and(label >= 0, label < k), [MARK, "label out of range", label + offset])
        with tf.control_dependencies([check]):
            return tf.identity(encoded), tf.cast(label, tf.int32)

    return load


def decode_fn(split, train: bool, augment: bool, seed: int = 0):
    """(unit, record, data, epoch) -> (uint8 image (size, size, c), int32 label): the transform ``mode`` and
    ``train`` say, keyed by (seed, epoch, the example's position in the files)."""
    import tensorflow as tf

    load, size, pixels = load_fn(split), split.size, pixels_fn(split, train, augment, seed)

    def decode(unit, rec, data, epoch):
        encoded, label = load(unit, rec, data)
        key = augment_keys(split.ids(unit, rec), epoch, seed)
        image = resize(pixels(encoded, key), size, exact=split.mode == "fixed")
        if train and augment:
            if split.mode == "inception":
                image = tf.image.stateless_random_flip_left_right(image, seed=tf.stack([key, tf.constant(1, tf.int64)]))
            else:
                image = augment_batch(image[None], key[None])[0]
        return tf.ensure_shape(image, split.shape), label

    return decode


def pixels_fn(split, train: bool, augment: bool, seed: int = 0):
    """(encoded, key) -> the decoded pixels the transform starts from, before resizing: the random box of a
    JPEG (decoded alone) for Inception-style training, the centre square to evaluate, the whole image when
    fixed. What StreamSplit.decode_only times."""
    import tensorflow as tf

    random_crop = train and augment and split.mode == "inception"

    def pixels(encoded, key):
        if split.raw_shape is not None:
            return tf.reshape(tf.io.decode_raw(encoded, tf.uint8), split.raw_shape)
        if split.mode == "fixed":
            return tf.io.decode_image(encoded, channels=split.channels, expand_animations=False)
        return decode_window(encoded, random_box(key) if random_crop else centre_box)

    return pixels


def fit_fn(split):
    """(unit, record, data) -> (uint8 image, label): the whole image resized to ``size`` (squashed, not
    cropped): what a split held in memory stores, and what its pad-and-crop augmentation then works on."""
    import tensorflow as tf

    load = load_fn(split)

    def fit(unit, rec, data):
        encoded, label = load(unit, rec, data)
        if split.raw_shape is not None:
            image = tf.reshape(tf.io.decode_raw(encoded, tf.uint8), split.raw_shape)
        else:
            image = tf.io.decode_image(encoded, channels=split.channels, expand_animations=False)
        return tf.ensure_shape(resize(image, split.size, exact=True), split.shape), label

    return fit


def centre_box(shape):
    """The centre square of EVAL_CROP of the shorter side: (y, x, h, w)."""
    import tensorflow as tf

    side = tf.cast(tf.cast(tf.minimum(shape[0], shape[1]), tf.float32) * EVAL_CROP, tf.int32)
    side = tf.maximum(side, 1)
    return (shape[0] - side) // 2, (shape[1] - side) // 2, side, side


def random_box(key):
    """A box of AREA of the image with aspect ASPECT, drawn from ``key``: (y, x, h, w)."""
    import tensorflow as tf

    def box(shape):
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.concat([shape, [3]], 0), tf.zeros([1, 0, 4], tf.float32), seed=tf.stack([key, tf.constant(0, tf.int64)]),
            min_object_covered=0.0, aspect_ratio_range=ASPECT, area_range=AREA, max_attempts=CROP_ATTEMPTS,
            use_image_if_no_bounding_boxes=True)
        return begin[0], begin[1], size[0], size[1]

    return box


def decode_window(encoded, box):
    """The box ``box(shape)`` picks of an encoded image: JPEGs decode only that window (decode_and_crop_jpeg);
    PNG, GIF and BMP decode whole and are sliced."""
    import tensorflow as tf

    def jpeg():
        y, x, h, w = box(tf.image.extract_jpeg_shape(encoded, output_type=tf.int32)[:2])
        return tf.io.decode_and_crop_jpeg(encoded, tf.stack([y, x, h, w]), channels=3)

    def other():
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        y, x, h, w = box(tf.shape(image, out_type=tf.int32)[:2])
        return image[y:y + h, x:x + w]

    return tf.cond(tf.io.is_jpeg(encoded), jpeg, other)


def resize(image, size: int, exact: bool):
    """``image`` (uint8 h x w x c) resized to size x size, uint8. ``exact``: an image already that size is left as
    it is (the fixed-size path keeps its pixels), and shrinking is antialiased."""
    import tensorflow as tf

    def resized():
        out = tf.image.resize(image, [size, size], method="bilinear", antialias=exact)
        return tf.cast(tf.clip_by_value(tf.round(out), 0, 255), tf.uint8)

    if not exact:
        return resized()
    same = tf.logical_and(tf.equal(tf.shape(image)[0], size), tf.equal(tf.shape(image)[1], size))
    return tf.cond(same, lambda: tf.identity(image), resized)
