"""Run profiles: which target/draft models, which method, which parameters.

A profile is a YAML file whose keys map one-to-one onto the dataclasses of
``schema.py`` (where each key is defined); ``loader.py`` reads, merges and validates
the YAML. Precedence, highest first: ``cli`` dict > ``--set`` overrides > profile YAML
(the including file over its includes) > dataclass defaults.
"""

from vlmspec_cli.profile.loader import (
    DEFAULT_PROFILE,
    include_chain,
    is_shipped_profile,
    key_rows,
    ENV_VAR,
    ProfileError,
    list_profiles,
    load_profile,
    profile_keys,
    profile_search_path,
    profile_to_dict,
    profile_to_yaml,
    resolve_profile_path,
    with_settings,
)
from vlmspec_cli.profile.schema import (
    AdaptiveTreeSpec,
    CaptionerSpec,
    DraftingSpec,
    Eagle3Spec,
    EnsembleSpec,
    GenerationSpec,
    HardwareSpec,
    HiddenSpec,
    ImageSpec,
    ModelSpec,
    Profile,
    PruneSpec,
    RelaxedSpec,
    RuntimeSpec,
    SamplingSpec,
    TreeSpec,
    TwigSpec,
    VideoSpec,
)

__all__ = [
    "include_chain", "key_rows",
    "DEFAULT_PROFILE", "ENV_VAR", "ProfileError", "list_profiles", "load_profile", "profile_keys",
    "profile_search_path", "profile_to_dict", "profile_to_yaml", "resolve_profile_path",
    "with_settings",
    "AdaptiveTreeSpec", "CaptionerSpec", "DraftingSpec", "Eagle3Spec", "EnsembleSpec",
    "GenerationSpec", "HardwareSpec", "HiddenSpec", "ImageSpec", "ModelSpec", "Profile", "PruneSpec", "RelaxedSpec", "RuntimeSpec",
    "SamplingSpec", "TreeSpec", "TwigSpec", "VideoSpec",
]
