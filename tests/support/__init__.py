"""Test support code shared by test modules (fakes and harnesses); holds no tests."""
