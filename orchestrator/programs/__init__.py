"""What a lowered program holds, read from its .pte: shared by lowering (checks) and results (analysis)."""
