"""Coding tasks graded by hidden tests in a fresh sandbox (docs/coding_agents.md).

``harness`` runs a trusted grading harness in a fresh sandbox and authenticates its report
(reusable by any grader); ``function_tests`` grades a function by unit tests (the
``code_tests`` environment's reward); ``tasks`` loads HumanEval, the generated easy split
and user task files.
"""
