"""Constraints on the answer: checked, compiled to a token automaton, and applied as a step of the loop."""
