"""A stand-in for nvidia-ml-py's ``pynvml`` module on machines without a GPU (CI).

This is the one fake the agent's tests use: NVML needs a GPU and its driver, and no CI machine has
either. It stops exactly at the pynvml boundary: it is a module object with pynvml's function
names and signatures, returns pynvml's own ctypes structures, and raises pynvml's own exception
classes (imported from the real package), so the agent's ``except nvml.NVMLError_...`` paths run
against the real classes. Tests set values and faults per GPU (``gpus[i]``) and emit XID events.
"""

# ruff: noqa: N802, N815
from __future__ import annotations

import queue
import threading
import types
from dataclasses import dataclass, field

import pynvml

H100 = "NVIDIA H100 80GB HBM3"
H100_MEMORY_BYTES = 81559 * 1024 * 1024
DRIVER_VERSION = "550.90.07"
PCI_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")


@dataclass
class FakeGpu:
    """One GPU's state; tests change the fields between scrapes."""

    index: int
    uuid: str
    pci_bus_id: str
    name: str = H100
    util_gpu: int = 0
    util_memory: int = 0
    memory_total: int = H100_MEMORY_BYTES
    memory_used: int = 0
    temperature_c: int = 34
    power_mw: int = 69_000
    sm_clock_mhz: int = 345
    processes: int = 0
    xid_events: bool = True
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)
    failing: dict[str, pynvml.NVMLError] = field(default_factory=dict)


@dataclass(frozen=True)
class FakeEventData:
    """pynvml's ``c_nvmlEventData_t`` holds a real device pointer; this holds a fake handle."""

    device: FakeGpu
    eventType: int
    eventData: int
    gpuInstanceId: int = 0
    computeInstanceId: int = 0


class FakeEventSet:
    def __init__(self) -> None:
        self.events: queue.Queue[FakeEventData] = queue.Queue()
        self.registered: set[int] = set()
        self.freed = False


def default_gpus(count: int) -> list[FakeGpu]:
    return [
        FakeGpu(
            index=i,
            uuid=f"GPU-{i:08x}-5a1e-4c0d-9b7e-{0x3F2A91C4E000 + i:012x}",
            pci_bus_id=f"00000000:{PCI_BUSES[i % len(PCI_BUSES)]}:00.0",
        )
        for i in range(count)
    ]


class FakeNvml(types.ModuleType):
    """Module object shaped like ``pynvml`` for the calls the agent makes."""

    NVMLError = pynvml.NVMLError
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = pynvml.NVMLError_DriverNotLoaded
    NVMLError_NoPermission = pynvml.NVMLError_NoPermission
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost
    NVMLError_Timeout = pynvml.NVMLError_Timeout
    NVMLError_Uninitialized = pynvml.NVMLError_Uninitialized
    NVMLError_Unknown = pynvml.NVMLError_Unknown
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    def __init__(self, gpus: list[FakeGpu], init_error: pynvml.NVMLError | None = None) -> None:
        super().__init__("fake_pynvml")
        self.gpus = gpus
        self.init_error = init_error
        self.count_error: pynvml.NVMLError | None = None
        self.driver_version = DRIVER_VERSION
        self.initialised = 0
        self.event_sets: list[FakeEventSet] = []
        self.calls = 0
        self._lock = threading.Lock()

    def emit_xid(self, index: int, xid: int) -> None:
        """What the driver does when GPU ``index`` hits XID ``xid``."""
        gpu = self.gpus[index]
        for event_set in self.event_sets:
            if index in event_set.registered and not event_set.freed:
                event_set.events.put(FakeEventData(gpu, pynvml.nvmlEventTypeXidCriticalError, xid))

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._check_init()
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        if self.count_error is not None:
            raise self.count_error
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check_init()
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return self._gpu(self.gpus[index], "nvmlDeviceGetHandleByIndex")

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> pynvml.nvmlPciInfo_t:
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo")
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id.encode()
        return info

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> pynvml.c_nvmlUtilization_t:
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        return pynvml.c_nvmlUtilization_t(gpu=gpu.util_gpu, memory=gpu.util_memory)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> pynvml.c_nvmlMemory_t:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        free = gpu.memory_total - gpu.memory_used
        return pynvml.c_nvmlMemory_t(total=gpu.memory_total, free=free, used=gpu.memory_used)

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu.temperature_c

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, clock: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetClockInfo")
        if clock != pynvml.NVML_CLOCK_SM:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu.sm_clock_mhz

    def nvmlDeviceGetComputeRunningProcesses(
        self, handle: FakeGpu
    ) -> list[pynvml.c_nvmlProcessInfo_t]:
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [
            pynvml.c_nvmlProcessInfo_t(pid=4000 + n, usedGpuMemory=1024 * 1024 * 1024)
            for n in range(gpu.processes)
        ]

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._check_init()
        event_set = FakeEventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(
        self, handle: FakeGpu, event_types: int, event_set: FakeEventSet
    ) -> None:
        gpu = self._gpu(handle, "nvmlDeviceRegisterEvents")
        if not gpu.xid_events:
            raise pynvml.NVMLError_NotSupported()
        if event_types & pynvml.nvmlEventTypeXidCriticalError:
            event_set.registered.add(gpu.index)

    def nvmlEventSetWait(self, event_set: FakeEventSet, timeoutms: int) -> FakeEventData:
        self._check_init()
        try:
            return event_set.events.get(timeout=timeoutms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError_Timeout() from None

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        self._check_init()
        event_set.freed = True

    def _check_init(self) -> None:
        if self.initialised <= 0:
            raise pynvml.NVMLError_Uninitialized()

    def _gpu(self, handle: FakeGpu, call: str) -> FakeGpu:
        self._check_init()
        with self._lock:
            self.calls += 1
        if handle.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if call in handle.failing:
            raise handle.failing[call]
        if call in handle.unsupported:
            raise pynvml.NVMLError_NotSupported()
        return handle


def fake_nvml(count: int = 8, init_error: pynvml.NVMLError | None = None) -> FakeNvml:
    """``count`` idle H100s, as a node of a p5.48xlarge or a DGX H100 shows them."""
    return FakeNvml(default_gpus(count), init_error)
