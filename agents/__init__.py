"""Agents: algorithms, nets, memories, action policies and schedules. Never imports ``orchestrator``."""
