"""fw inside Ray Train (a package named ``ray_train``, not ``ray``: pytest puts tests/ on the path, where a
``ray`` package would hide the real one)."""
