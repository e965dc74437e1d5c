"""The model zoo and `--model` specs: the small GPT, its torch-free config, presets."""
