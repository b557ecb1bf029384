"""The engine cache: whole compiled modules and engines, stored by a key of everything they are made from, reused
instead of compiled or built again."""
from torchkiln.cache.engine_cache import EngineCache
from torchkiln.cache.key import block_key
from torchkiln.cache.module_cache import ModuleCache
from torchkiln.cache.weights import Unkeyable
from torchkiln.cache.store import EngineStore, engines_dir, max_bytes

__all__ = ["EngineCache", "EngineStore", "ModuleCache", "Unkeyable", "block_key", "engines_dir", "max_bytes"]
