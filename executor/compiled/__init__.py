"""remat's schedule as torch.compile's partition (docs/compile.md)."""

from executor.compiled.api import CompiledModel, CompileReport, compile

__all__ = ["CompileReport", "CompiledModel", "compile"]
