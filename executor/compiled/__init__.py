"""remat's schedule as torch.compile's partition (docs/compile.md)."""

from executor.compiled.api import CompileCheck, CompiledModel, CompileReport, compile

__all__ = ["CompileCheck", "CompileReport", "CompiledModel", "compile"]
