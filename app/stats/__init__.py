"""Steady's pure numerical core: numpy/scipy only, arrays in, frozen dataclasses out.

Never import fastapi, sqlalchemy, pydantic or other ``app.*`` modules from here.
"""
