"""tftoolkit data prepare: make the datasets the toolkit trains on."""

from __future__ import annotations

from .common import Parser


def add(sub) -> None:
    from ..data import shapes

    data = sub.add_parser("data", help="prepare datasets (shapes16k)",
                          description="Make the datasets the toolkit trains on.")
    data_sub = data.add_subparsers(dest="data", metavar="WHAT", parser_class=Parser)
    data_sub.required = True
    p = data_sub.add_parser("prepare", help="render shapes16k into TFRecord shards + manifest.json",
                            description="Render shapes16k: 10 balanced classes of geometric shapes (RGB, random "
                                        "position, scale, rotation, colours, background, clutter and noise), the "
                                        "same bytes for the same seed. Writes TFRecord shards and manifest.json "
                                        "(docs/guides/data.md). Does nothing if --out already holds the same "
                                        "dataset, verified.")
    p.add_argument("--out", default=None, help="folder to write (default: shapes16k in the data home: "
                                               "$TFTOOLKIT_DATA_DIR, else ~/.cache/tftoolkit/datasets; see "
                                               "`tftoolkit env`)")
    p.add_argument("--images", type=int, default=16000, help="training images (default: 16000)")
    p.add_argument("--val-images", type=int, default=4000, help="validation images (default: 4000)")
    p.add_argument("--size", type=int, default=32, help="image side in pixels (default: 32)")
    p.add_argument("--seed", type=int, default=0, help="random seed; the same seed gives byte-identical files "
                                                       "(default: 0)")
    p.add_argument("--shard-size", type=int, default=shapes.SHARD_SIZE,
                   help=f"images per TFRecord shard (default: {shapes.SHARD_SIZE}, i.e. 16 training shards)")
    p.add_argument("--force", action="store_true", help="render again even if --out already holds this dataset")
    p.set_defaults(func=prepare)


def prepare(args) -> int:
    from ..data import home, shapes

    m = shapes.prepare(args.out, images=args.images, val_images=args.val_images, size=args.size, seed=args.seed,
                       shard_size=args.shard_size, force=args.force)
    splits = m["splits"]
    out = args.out or home.default_dir()
    print(f"{out}: shapes16k, {splits['train']['examples']} train images in {len(splits['train']['shards'])} "
          f"shard(s)" + (f", {splits['val']['examples']} val images in {len(splits['val']['shards'])} shard(s)"
                         if "val" in splits else "") + f", {m['image_shape'][0]}x{m['image_shape'][1]} RGB, "
          f"{m['num_classes']} classes; manifest.json")
    return 0
