"""Tests of the command line: flags and variables, top."""
