"""A run config of configs/ with its relative paths made absolute, for scripts that write a copy of
it elsewhere: fedlora reads a config's relative paths against the config's own directory."""
import os

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def absolute_paths(config):
    for section, key in (("model", "path"), ("data", "train_path"), ("data", "eval_path")):
        value = config.get(section, {}).get(key)
        if value and not os.path.isabs(value):
            config[section][key] = os.path.normpath(os.path.join(CONFIGS, value))
    return config
