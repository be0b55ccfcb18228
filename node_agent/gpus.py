"""The node's GPUs as NVML reports them, one reading per GPU per collection.

NVML is started once per agent. A node without a GPU or driver is normal (a CPU node, a broken
driver after an upgrade): the reader then says why in one line and reads nothing, so the agent
keeps serving ``gpu_autoscaler_agent_nvml_up 0`` instead of dying. A field a GPU does not
support, or that the agent may not read, is left out for that GPU; a GPU that fell off the bus is
left out of the collection (and logged once) while the others are still read, so one broken card
never blinds the node.

The last XID per GPU (dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS``) comes from NVML's event API,
waited on by a daemon thread, since XIDs are events rather than values NVML can be asked for.

``nvml`` is any object shaped like nvidia-ml-py's ``pynvml`` module; by default that module is
imported lazily so the core imports without it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger(__name__)

MIB = 1024 * 1024
XID_WAIT_MS = 200
XID_RETRY_S = 1.0
NOT_INSTALLED = "NVML: nvidia-ml-py is not installed (pip install 'hybrid-gpu-autoscaler[agent]')"

T = TypeVar("T")


@dataclass(frozen=True)
class GpuIdentity:
    """What names a GPU in every series: stable for the life of the agent."""

    index: int
    uuid: str
    model: str
    pci_bus_id: str


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one collection; a field is None when the GPU cannot report it."""

    identity: GpuIdentity
    util_pct: float | None = None
    mem_copy_util_pct: float | None = None
    fb_used_mib: float | None = None
    fb_free_mib: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    compute_processes: int | None = None
    last_xid: int | None = None


class _GpuLostError(Exception):
    """Raised inside one GPU's read so the whole GPU, not one field, is left out."""


@dataclass
class _Device:
    index: int
    handle: Any = None
    identity: GpuIdentity | None = None


def load_nvml() -> Any:
    """nvidia-ml-py's module, imported only when an agent actually reads GPUs."""
    import pynvml

    return pynvml


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class GpuReader:
    """Owns the NVML session: ``start`` once (then ``watch_xids``), ``read`` per scrape from any
    thread, ``close`` once."""

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml: Any = nvml
        self.available = False
        self.reason: str | None = None
        self.driver_version = ""
        self._devices: list[_Device] = []
        self._lock = threading.Lock()
        self._warned: set[tuple[int, str, str]] = set()
        self._lost: set[int] = set()
        self._xid: dict[int, int] = {}
        self._xid_thread: threading.Thread | None = None
        self._xid_stop = threading.Event()
        self._event_set: Any = None

    @property
    def gpu_count(self) -> int:
        return len(self._devices)

    @property
    def lost_count(self) -> int:
        with self._lock:
            return len(self._lost)

    def start(self) -> bool:
        """Start NVML and enumerate the GPUs; False (with ``reason`` set) when NVML cannot."""
        if self._nvml is None:
            try:
                self._nvml = load_nvml()
            except ImportError:
                self.reason = NOT_INSTALLED
                return False
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            self.reason = self._init_reason(error)
            return False
        try:
            count = int(nvml.nvmlDeviceGetCount())
            self.driver_version = self._optional_system(nvml.nvmlSystemGetDriverVersion)
        except nvml.NVMLError as error:
            self.reason = f"NVML: cannot list GPUs ({error})"
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError as shutdown_error:
                log.debug("NVML: shutdown failed: %s", shutdown_error)
            return False
        self._devices = [_Device(index) for index in range(count)]
        for device in self._devices:
            self._identify(device)
        self.available = True
        return True

    def read(self) -> list[GpuReading]:
        """The GPUs that answer now, in index order; lost ones are logged and left out."""
        if not self.available:
            return []
        readings = []
        for device in self._devices:
            try:
                reading = self._read_device(device)
            except _GpuLostError as lost:
                self._mark_lost(device, str(lost))
                continue
            self._mark_back(device)
            readings.append(reading)
        return readings

    def close(self) -> None:
        """Stop the XID watch and end the NVML session; safe to call twice."""
        if not self.available:
            return
        self.available = False
        self._xid_stop.set()
        if self._xid_thread is not None:
            self._xid_thread.join(timeout=XID_WAIT_MS / 1000 * 4)
        nvml = self._nvml
        if self._event_set is not None:
            try:
                nvml.nvmlEventSetFree(self._event_set)
            except nvml.NVMLError as error:
                log.debug("NVML: freeing the XID event set failed: %s", error)
            self._event_set = None
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as error:
            log.debug("NVML: shutdown failed: %s", error)

    def _init_reason(self, error: Exception) -> str:
        nvml = self._nvml
        if isinstance(error, nvml.NVMLError_LibraryNotFound):
            return "NVML: library not found (no NVIDIA driver on this machine)"
        if isinstance(error, nvml.NVMLError_DriverNotLoaded):
            return "NVML: the NVIDIA driver is not loaded (no GPU, or the driver failed to start)"
        if isinstance(error, nvml.NVMLError_NoPermission):
            return "NVML: no permission to open the GPUs (run the agent as a user that may)"
        return f"NVML: cannot start ({error})"

    def _optional_system(self, call: Callable[[], str | bytes]) -> str:
        try:
            return _text(call())
        except self._nvml.NVMLError:
            return ""

    def _identify(self, device: _Device) -> bool:
        """Fill in the GPU's handle and names; False while the GPU does not answer."""
        nvml = self._nvml
        try:
            if device.handle is None:
                device.handle = nvml.nvmlDeviceGetHandleByIndex(device.index)
            handle = device.handle
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            model = self._name(lambda: nvml.nvmlDeviceGetName(handle))
            pci_bus_id = self._name(lambda: nvml.nvmlDeviceGetPciInfo(handle).busId)
        except nvml.NVMLError as error:
            self._mark_lost(device, str(error))
            return False
        device.identity = GpuIdentity(device.index, uuid, model, pci_bus_id)
        return True

    def _name(self, call: Callable[[], str | bytes]) -> str:
        """A naming label the GPU may not support (virtual GPUs): empty rather than no GPU."""
        nvml = self._nvml
        try:
            return _text(call())
        except nvml.NVMLError_GpuIsLost:
            raise
        except nvml.NVMLError:
            return ""

    def _read_device(self, device: _Device) -> GpuReading:
        if device.identity is None and not self._identify(device):
            raise _GpuLostError("cannot read its identity")
        identity = device.identity
        assert identity is not None
        nvml = self._nvml
        handle = device.handle
        util = self._field(device, "utilisation", nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = self._field(device, "memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        temp = self._field(
            device, "temperature", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
        )
        power_mw = self._field(device, "power", nvml.nvmlDeviceGetPowerUsage, handle)
        sm_clock = self._field(
            device, "SM clock", nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM
        )
        processes = self._field(
            device, "processes", nvml.nvmlDeviceGetComputeRunningProcesses, handle
        )
        with self._lock:
            last_xid = self._xid.get(device.index)
        return GpuReading(
            identity=identity,
            util_pct=None if util is None else float(util.gpu),
            mem_copy_util_pct=None if util is None else float(util.memory),
            fb_used_mib=None if memory is None else float(int(memory.used) // MIB),
            fb_free_mib=None if memory is None else float(int(memory.free) // MIB),
            temp_c=None if temp is None else float(temp),
            power_w=None if power_mw is None else int(power_mw) / 1000.0,
            sm_clock_mhz=None if sm_clock is None else float(sm_clock),
            compute_processes=None if processes is None else len(processes),
            last_xid=last_xid,
        )

    def _field(self, device: _Device, what: str, call: Callable[..., T], *args: Any) -> T | None:
        """One NVML call for one GPU: None when unsupported or refused, _GpuLostError when gone."""
        nvml = self._nvml
        try:
            return call(*args)
        except nvml.NVMLError_GpuIsLost as error:
            raise _GpuLostError(str(error)) from None
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_NoPermission):
            return None
        except nvml.NVMLError as error:
            self._warn_once(device.index, what, str(error))
            return None

    def _warn_once(self, index: int, what: str, error: str) -> None:
        key = (index, what, error)
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        log.warning("GPU %d: NVML cannot read its %s (%s); left out", index, what, error)

    def _mark_lost(self, device: _Device, why: str) -> None:
        with self._lock:
            if device.index in self._lost:
                return
            self._lost.add(device.index)
        name = device.identity.uuid if device.identity else "identity unknown"
        log.warning(
            "GPU %d (%s) does not answer NVML (%s); left out of /metrics until it does",
            device.index,
            name,
            why,
        )

    def _mark_back(self, device: _Device) -> None:
        with self._lock:
            if device.index not in self._lost:
                return
            self._lost.discard(device.index)
        log.info("GPU %d answers NVML again", device.index)

    def watch_xids(self) -> None:
        """Register every GPU that supports it for XID events and wait for them in a daemon
        thread; GPUs that do not support the events simply report no XID."""
        if not self.available or self._xid_thread is not None:
            return
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as error:
            log.info("NVML: no XID events on this node (%s)", error)
            return
        watched: dict[str, int] = {}
        for device in self._devices:
            if device.identity is None:
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(
                    device.handle, nvml.nvmlEventTypeXidCriticalError, event_set
                )
            except nvml.NVMLError as error:
                if not isinstance(error, nvml.NVMLError_NotSupported):
                    log.info("GPU %d: no XID events (%s)", device.index, error)
                continue
            watched[device.identity.uuid] = device.index
        if not watched:
            try:
                nvml.nvmlEventSetFree(event_set)
            except nvml.NVMLError as error:
                log.debug("NVML: freeing the XID event set failed: %s", error)
            return
        with self._lock:
            self._xid = dict.fromkeys(watched.values(), 0)
        self._event_set = event_set
        self._xid_thread = threading.Thread(
            target=self._watch_xids, args=(event_set, watched), name="nvml-xid", daemon=True
        )
        self._xid_thread.start()

    def _watch_xids(self, event_set: Any, watched: dict[str, int]) -> None:
        nvml = self._nvml
        failing: str | None = None
        while not self._xid_stop.is_set():
            try:
                event = nvml.nvmlEventSetWait(event_set, XID_WAIT_MS)
            except nvml.NVMLError_Timeout:
                continue
            except nvml.NVMLError as error:
                if str(error) != failing:
                    failing = str(error)
                    log.warning("NVML: waiting for XID events failed (%s); retrying", error)
                self._xid_stop.wait(XID_RETRY_S)
                continue
            failing = None
            if not int(event.eventType) & nvml.nvmlEventTypeXidCriticalError:
                continue
            try:
                index = watched.get(_text(nvml.nvmlDeviceGetUUID(event.device)))
            except nvml.NVMLError:
                index = None
            if index is None:
                continue
            xid = int(event.eventData)
            with self._lock:
                self._xid[index] = xid
            log.warning("GPU %d reported XID %d", index, xid)
