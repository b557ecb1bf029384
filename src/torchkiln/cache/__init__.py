"""The engine cache: engines stored by a key of everything they are made from, reused instead of built again."""
from torchkiln.cache.engine_cache import EngineCache
from torchkiln.cache.key import Unkeyable, block_key
from torchkiln.cache.store import EngineStore, engines_dir, max_bytes

__all__ = ["EngineCache", "EngineStore", "Unkeyable", "block_key", "engines_dir", "max_bytes"]
