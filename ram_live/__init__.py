"""ram_live: merge RL-trained agents with RAM (Reinforced Agent Merging), in process, tensor by tensor.

>>> from ram_live import ram_merge, merge, probe
>>> generalist = ram_merge([coder, tool_agent, memory_agent], base=base_model)   # doctest: +SKIP
"""

from .api import merge, merge_task_vectors, ram_merge
from .engine import MergeInfo
from .errors import (
    ConfigError,
    InputMismatchError,
    MethodExistsError,
    MissingBaseError,
    NoAgentsError,
    NonFiniteError,
    OutOfSpaceError,
    OutputExistsError,
    RamLiveError,
    SearchError,
    UnknownMethodError,
    UnsupportedInputError,
)
from .methods import (
    Activity,
    DareLinearConfig,
    DareTiesConfig,
    LinearConfig,
    RamConfig,
    RamPlusConfig,
    RamPlusSoftConfig,
    TaskArithmeticConfig,
    TiesConfig,
    available_methods,
    get_method,
    register_method,
)
from .mergekit_yaml import MergekitPlan, from_mergekit_yaml
from .peft import (
    RECOMMENDED_SPARSIFY,
    AdapterMergeReport,
    DenseDeltaWarning,
    RelativeThreshold,
    TopK,
    UnsupportedAdapterError,
    lora_deltas,
    ram_merge_adapter_files,
    ram_merge_adapters,
    refactor,
)
from .importance import adam_importance, empirical_fisher
from .probe import ProbeReport, probe
from .schedule import MergeResult, RAMSchedule
from .search import ExtrapolationWarning, SearchResult, search
from .store import (
    BaseMismatchError,
    CorruptSnapshotError,
    Snapshot,
    SnapshotNotFoundError,
    SnapshotStore,
    SnapshotWriter,
    StoreError,
)

__version__ = "0.1.0"

__all__ = [
    "merge", "ram_merge", "merge_task_vectors", "probe", "ram_merge_adapters", "ram_merge_adapter_files",
    "adam_importance", "empirical_fisher",
    "from_mergekit_yaml", "MergekitPlan",
    "lora_deltas", "refactor", "TopK", "RelativeThreshold", "RECOMMENDED_SPARSIFY", "AdapterMergeReport",
    "UnsupportedAdapterError", "DenseDeltaWarning",
    "search", "SearchResult", "SearchError", "ExtrapolationWarning",
    "SnapshotStore", "Snapshot", "SnapshotWriter", "RAMSchedule", "MergeResult",
    "StoreError", "BaseMismatchError", "SnapshotNotFoundError", "CorruptSnapshotError", "ProbeReport", "MergeInfo",
    "register_method", "get_method", "available_methods", "Activity",
    "LinearConfig", "TaskArithmeticConfig", "TiesConfig", "DareLinearConfig", "DareTiesConfig",
    "RamConfig", "RamPlusConfig", "RamPlusSoftConfig",
    "RamLiveError", "InputMismatchError", "NonFiniteError", "NoAgentsError", "ConfigError",
    "UnknownMethodError", "MethodExistsError", "MissingBaseError", "UnsupportedInputError", "OutOfSpaceError",
    "OutputExistsError",
]
