"""The explorer app's kernels (``./run.sh explorer``): Voila's preheated pool, with idle culling.

A page takes a kernel that has already run the app (``--preheat_kernel``), so its first figure
shows in seconds; idle culling ends the kernel of a page that vanished without saying so.  The
two meet badly: a kernel in the pool is never culled, but once a page takes it, its idle time
counts from its last message -- when it ran the app, maybe hours before -- and the page
connects only once its scripts have loaded (seconds, more on a room's Wi-Fi).  A cull check in
between ended the kernel under the page.  Here the first check after a page took the kernel
counts as activity: the page has a whole idle timeout to connect.
"""

from __future__ import annotations

from datetime import datetime, timezone

from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

__all__ = ["ExplorerKernelManager"]


class ExplorerKernelManager(AsyncMappingKernelManager):
    """Voila's kernel manager (``VoilaConfiguration.multi_kernel_manager_class``) that gives a kernel
    taken from the pool a fresh idle clock.  Voila's pool wraps it, and checks pooled kernels
    itself: every kernel seen here has left the pool, or never was in one."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._seen: set[str] = set()

    async def cull_kernel_if_idle(self, kernel_id: str) -> None:
        if kernel_id not in self._seen and kernel_id in self._kernels:
            self._seen.add(kernel_id)
            self._kernels[kernel_id].last_activity = datetime.now(timezone.utc)
            return
        await super().cull_kernel_if_idle(kernel_id)

    async def shutdown_kernel(self, kernel_id: str, *args, **kwargs) -> None:
        self._seen.discard(kernel_id)
        await super().shutdown_kernel(kernel_id, *args, **kwargs)
