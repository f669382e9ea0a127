"""``model_parallel``: data parallel x tensor parallel over a 2-D DeviceMesh that the module's
``configure_model`` parallelizes (``ModelParallelStrategy``, ``strategy.py``)."""

from framework.strategies.model_parallel.strategy import MESH_DIMS, ModelParallelStrategy, mesh_shape

__all__ = ["MESH_DIMS", "ModelParallelStrategy", "mesh_shape"]
