"""Reads gin files as text (macros, bindings, includes), never gin's global config.

Owns GinConfig: the experiment files' macros (row_label, variant, heads, ...)
and the scale files' (d_model, inputs_length, train_steps, ...), read without
resolving any configurable and without touching gin's global configuration.
"""
import collections
import os
import re

from gin import config_parser

from mtf_talking_heads.core import gin_paths

GIN_DIR = gin_paths.gin_dir()


class Reference(collections.namedtuple("Reference", ["name", "evaluate"])):
  """A configurable reference (@name or @name()) met while reading macros."""

  def __str__(self):
    return "@" + self.name + ("()" if self.evaluate else "")


class _MacroRef(collections.namedtuple("_MacroRef", ["name"])):
  """A macro reference (%name), resolved after all files are read."""


class _Delegate(config_parser.ParserDelegate):

  def configurable_reference(self, scoped_configurable_name, evaluate):
    return Reference(scoped_configurable_name, evaluate)

  def macro(self, macro_name):
    return _MacroRef(macro_name)


def gin_path(name, including_file=None, gin_dir=GIN_DIR):
  """Resolves an include / --gin_file the way our gin search path does."""
  candidates = [name] if os.path.isabs(name) else [os.path.join(gin_dir, name)]
  if including_file and not os.path.isabs(name):
    candidates.append(os.path.join(os.path.dirname(including_file), name))
  elif not os.path.isabs(name):
    candidates.append(name)  # a --gin_file path (as mtf_th train takes it)
  for path in candidates:
    if os.path.isfile(path):
      return path
  raise ValueError("gin file %r not found (looked in %s)"
                   % (name, ", ".join(candidates)))


def _read_statements(text, filename):
  try:
    return list(config_parser.ConfigParser(text, _Delegate()))
  except SyntaxError as e:
    raise ValueError("%s: gin syntax error: %s" % (filename, e)) from None


def _collect(path, config, gin_dir, stack=()):
  if path in stack:
    raise ValueError("gin include cycle: %s" % " -> ".join(stack + (path,)))
  with open(path) as f:
    statements = _read_statements(f.read(), path)
  config._add(statements, path, gin_dir, stack + (path,))  # pylint: disable=protected-access


def _binding_key(statement):
  """'scope/selector.arg' of a binding; None for a macro (name = value)."""
  if (not statement.scope and not statement.arg_name
      and "." not in statement.selector):
    return None
  return "%s%s.%s" % (statement.scope + "/" if statement.scope else "",
                      statement.selector, statement.arg_name)


def _resolve(value, macros, seen=()):
  if isinstance(value, _MacroRef):
    if value.name in seen:
      raise ValueError("gin macro cycle: %s" % " -> ".join(seen + (value.name,)))
    if value.name not in macros:
      raise ValueError("gin macro %%%s is used but never defined" % value.name)
    return _resolve(macros[value.name], macros, seen + (value.name,))
  if isinstance(value, list) or type(value) is tuple:  # not Reference
    return type(value)(_resolve(v, macros, seen) for v in value)
  if isinstance(value, dict):
    return {k: _resolve(v, macros, seen) for k, v in value.items()}
  return value


class GinConfig(object):
  """The macros of a list of gin files and bindings.

  Reads the files with gin's own parser but never touches gin's global
  configuration (training.parse_gin clears it; a sweep reads dozens of
  configurations, and tests share one process), and resolves no
  configurable.  Follows ``include`` statements (relative to gin/, like the
  training command's search path) and lets later bindings override earlier
  ones, as gin does.  Macros (``name = value`` at top level) and bindings
  (``scope/configurable.arg = value``) are kept, unevaluated.

  Attributes:
    includes: every file included, in reading order.
    imports: the modules the files import (``import a.b``), in reading order.
    origins: {macro: the file that set it last (None: a gin_param)}.
  """

  def __init__(self, gin_files=(), gin_params=(), gin_dir=GIN_DIR):
    self._macros = {}
    self.origins = {}
    self._bindings = {}
    self.includes = []
    self.imports = []
    for name in gin_files:
      path = gin_path(name, None, gin_dir)
      self.includes.append(name)
      _collect(path, self, gin_dir)
    for binding in gin_params:
      self._add(_read_statements(binding, "gin_param %r" % binding), None,
                gin_dir, ())

  def _add(self, statements, including_file, gin_dir, stack):
    for statement in statements:
      if isinstance(statement, config_parser.IncludeStatement):
        path = gin_path(statement.filename, including_file, gin_dir)
        self.includes.append(statement.filename)
        _collect(path, self, gin_dir, stack)
      elif isinstance(statement, config_parser.ImportStatement):
        self.imports.append(statement.module)
      elif isinstance(statement, config_parser.BindingStatement):
        key = _binding_key(statement)
        if key is None:
          self._macros[statement.selector] = statement.value
          self.origins[statement.selector] = including_file
        else:
          self._bindings[key] = statement.value

  def binding(self, key, default=None):
    """The value bound to 'scope/configurable.arg' (macros resolved)."""
    if key not in self._bindings:
      return default
    return _resolve(self._bindings[key], self._macros)

  def binding_keys(self):
    """Every 'scope/configurable.arg' bound, in no particular order."""
    return list(self._bindings)

  def __contains__(self, name):
    return name in self._macros

  def references(self):
    """(macro names, configurable names) that some macro or binding refers
    to (%name, @name), as gin counts a macro or configurable used.

    Example: after `heads = 8` and `mtf_th.X.heads = %heads`,
    references() == ({"heads"}, set()).
    """
    macros, configurables = set(), set()

    def walk(value):
      if isinstance(value, _MacroRef):
        macros.add(value.name)
      elif isinstance(value, Reference):
        configurables.add(value.name)
      elif isinstance(value, (list, tuple, set)):
        for v in value:
          walk(v)
      elif isinstance(value, dict):
        for v in value.values():
          walk(v)

    for value in list(self._macros.values()) + list(self._bindings.values()):
      walk(value)
    return macros, configurables

  def get(self, name, default=None):
    """The value of macro `name` (macro references resolved)."""
    if name not in self._macros:
      return default
    return _resolve(self._macros[name], self._macros)

  def require(self, name, where):
    if name not in self._macros:
      raise ValueError("%s does not define the gin macro %r" % (where, name))
    return self.get(name)


def referenced_macros(gin_files, gin_dir):
  """Names of the macros that gin files reference as %name (not includes)."""
  used = set()
  for name in gin_files:
    with open(gin_path(name, gin_dir=gin_dir)) as f:
      used.update(re.findall(r"%([A-Za-z_][A-Za-z0-9_]*)", f.read()))
  return used


def own_settings(name, gin_dir=GIN_DIR):
  """Macro names and binding keys a gin file sets itself (not its includes).

  Example: own_settings("layouts/data_parallel.gin") ==
  {"mesh_shape", "layout"}.
  """
  with open(gin_path(name, gin_dir=gin_dir)) as f:
    statements = _read_statements(f.read(), name)
  return {_binding_key(s) or s.selector for s in statements
          if isinstance(s, config_parser.BindingStatement)}
