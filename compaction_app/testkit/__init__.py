"""Deterministic stand-ins and generators the tests and the benches share (neither imports
the other): a provider stand-in that speaks the providers' wire protocols, session
generators, and the one Chromium launch. Not used by the service itself."""
