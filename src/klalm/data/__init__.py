"""klalm.data: streamed, packed, resumable LM data (sources, tokenisers, packing, token shards, datamodule)."""

from klalm.data.datamodule import DATASETS, TextDataModule, local_files, resolve_rank
from klalm.data.loader import ResumableLoader
from klalm.data.packing import PackedTextDataset
from klalm.data.prepare import prepare_shards
from klalm.data.records import BadRecordError, BadRecordPolicy, DataFileError, Record
from klalm.data.shards import ShardDataset, ShardSource, TokenShards
from klalm.data.sources import SOURCES, FileSource, HFSource, PythonDocsSource, build_source
from klalm.data.tokenizer import TOKENIZERS, load_tokenizer, named_tokenizer, train_bpe_tokenizer

__all__ = [
    "DATASETS",
    "SOURCES",
    "TOKENIZERS",
    "BadRecordError",
    "BadRecordPolicy",
    "DataFileError",
    "FileSource",
    "HFSource",
    "PackedTextDataset",
    "PythonDocsSource",
    "Record",
    "ResumableLoader",
    "ShardDataset",
    "ShardSource",
    "TextDataModule",
    "TokenShards",
    "build_source",
    "local_files",
    "load_tokenizer",
    "named_tokenizer",
    "prepare_shards",
    "resolve_rank",
    "train_bpe_tokenizer",
]
