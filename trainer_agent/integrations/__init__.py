"""Thin adapters from training frameworks to TrainerAgent; each imports its framework only when imported itself."""
