"""A thread-safe LRU capped in bytes: the RAM tier of the projector-row and image-prefix caches."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

Value = TypeVar("Value")


class BytesLru(Generic[Value]):
    """Values by key, least recently used out first once their bytes pass the cap; a value
    larger than the whole cap is not kept."""

    def __init__(self, cap_bytes: int, size_of: Callable[[Value], int]) -> None:
        self._cap_bytes, self._size_of = cap_bytes, size_of
        self._values: OrderedDict[str, Value] = OrderedDict()
        self._lock = threading.Lock()
        self.used_bytes = 0

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: str) -> Value | None:
        """The value, now the most recently used; None when absent."""
        with self._lock:
            found = self._values.get(key)
            if found is not None:
                self._values.move_to_end(key)
            return found

    def put(self, key: str, value: Value) -> None:
        """Keep a value (a key already held keeps its first value)."""
        size = self._size_of(value)
        with self._lock:
            if key in self._values or size > self._cap_bytes:
                return
            self._values[key] = value
            self.used_bytes += size
            while self.used_bytes > self._cap_bytes:
                _, old = self._values.popitem(last=False)
                self.used_bytes -= self._size_of(old)

    def pop(self, key: str) -> None:
        """Forget a key, if held."""
        with self._lock:
            old = self._values.pop(key, None)
            if old is not None:
                self.used_bytes -= self._size_of(old)
