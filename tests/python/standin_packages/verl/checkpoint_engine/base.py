"""Stand-in of verl/checkpoint_engine/base.py at verl-project/verl 1dda039b9: the backend
registry and the abstract engine with the upstream names and signatures (the registry's
register(backend) / get / new, the engine's prepare, build_topology (a class method),
init_process_group(**kwargs), finalize, async send_weights(weights, global_steps=None)
and receive_weights(global_steps=None), wire_format "named_tensors"). Bodies are the
tests' own."""

from abc import ABC, abstractmethod


class CheckpointEngineRegistry:
    _registry = {}

    def register(backend: str):
        def add(cls):
            CheckpointEngineRegistry._registry[backend] = cls
            return cls

        return add

    @classmethod
    def get(cls, backend: str):
        if backend not in cls._registry:
            raise ValueError(f"stand-in registry: no backend {backend!r} "
                             f"(have {sorted(cls._registry)})")
        return cls._registry[backend]

    @classmethod
    def new(cls, backend: str, *args, **kwargs):
        return cls.get(backend)(*args, **kwargs)


class CheckpointEngine(ABC):
    wire_format = "named_tensors"

    @abstractmethod
    def prepare(self):
        raise NotImplementedError

    @classmethod
    @abstractmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list):
        raise NotImplementedError

    @abstractmethod
    def init_process_group(self, **kwargs):
        raise NotImplementedError

    @abstractmethod
    def finalize(self):
        raise NotImplementedError

    @abstractmethod
    async def send_weights(self, weights, global_steps: int = None):
        raise NotImplementedError

    @abstractmethod
    async def receive_weights(self, global_steps: int = None):
        raise NotImplementedError
