"""earl.runtime"""
