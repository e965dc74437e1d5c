"""`shardsched tradeoff`: step time against memory budget, auto plan vs every uniform configuration."""
