"""TrainModules and DataModules that the recipes in conf/ use."""
